#!/usr/bin/env bash
# Runs each test program given and prints one line per program: "ok",
# "skipped" (with the program's last line, its reason) or "FAILED", with
# the seconds it took; a failed program's whole output follows its line,
# and only then. TESTS_VERBOSE=1 prints every program's output as it runs.
# Ends with one summary line "tests: N passed, N failed, K skipped"
# counting programs (CI greps it: keep it so). A program that exits 77
# (the Automake convention) ran nothing it could check, a CUDA suite on a
# machine without a device say: it is counted as skipped, never as passed.
# Exits non-zero if any program failed.
set -u
passed=0; failed=0; skipped=0; failures=""; skips=""
out=$(mktemp "${TMPDIR:-/tmp}/kinfer-run.XXXXXX")
trap 'rm -f "$out"' EXIT
for t in "$@"; do
  start=$(date +%s)
  if [ "${TESTS_VERBOSE:-0}" = 1 ]; then
    echo "=== $t"
    "$t" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
  else
    "$t" >"$out" 2>&1
    rc=$?
  fi
  took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    passed=$((passed+1)); printf 'ok       %s (%ss)\n' "$t" "$took"
  elif [ "$rc" -eq 77 ]; then
    skipped=$((skipped+1)); skips="$skips $t"
    why=$(grep -v '^[[:space:]]*$' "$out" | tail -n1)
    printf 'skipped  %s (%ss)%s\n' "$t" "$took" "${why:+: $why}"
  else
    failed=$((failed+1)); failures="$failures $t"
    printf 'FAILED   %s (%ss, exit %s); its output:\n' "$t" "$took" "$rc"
    [ "${TESTS_VERBOSE:-0}" = 1 ] || sed 's/^/    /' "$out"
    printf '=== end of %s\n' "$t"
  fi
done
[ -n "$skips" ] && echo "skipped:$skips"
[ -n "$failures" ] && echo "failed:$failures"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
