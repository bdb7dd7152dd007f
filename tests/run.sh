#!/usr/bin/env bash
# Runs each test program given, prints its output, and ends with one
# summary line "N passed, N failed" counting programs. Exits non-zero if
# any program failed.
set -u
passed=0; failed=0; failures=""
for t in "$@"; do
  echo "=== $t"
  start=$(date +%s)
  if "$t"; then
    passed=$((passed+1)); echo "=== $t ok ($(( $(date +%s) - start ))s)"
  else
    failed=$((failed+1)); failures="$failures $t"; echo "=== $t FAILED ($(( $(date +%s) - start ))s)"
  fi
done
[ -n "$failures" ] && echo "failed:$failures"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
