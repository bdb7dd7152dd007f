#!/usr/bin/env bash
# Runs each test program given, prints its output, and ends with one
# summary line "tests: N passed, N failed, K skipped" counting programs.
# A program that exits 77 (the Automake convention) ran nothing it could
# check, a CUDA suite on a machine without a device say: it is counted as
# skipped, never as passed. Exits non-zero if any program failed.
set -u
passed=0; failed=0; skipped=0; failures=""; skips=""
for t in "$@"; do
  echo "=== $t"
  start=$(date +%s)
  "$t"
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    passed=$((passed+1)); echo "=== $t ok (${took}s)"
  elif [ "$rc" -eq 77 ]; then
    skipped=$((skipped+1)); skips="$skips $t"; echo "=== $t skipped (${took}s)"
  else
    failed=$((failed+1)); failures="$failures $t"; echo "=== $t FAILED (${took}s)"
  fi
done
[ -n "$skips" ] && echo "skipped:$skips"
[ -n "$failures" ] && echo "failed:$failures"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
