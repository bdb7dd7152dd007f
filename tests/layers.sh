#!/usr/bin/env bash
# layers.sh - checks the shape of the source tree (make test runs it):
#
# 1. Folders include one way. Every `#include "../DIR/..."` in a source
#    folder (everything but tests/) is an edge FOLDER -> DIR; the graph
#    must have no cycle (docs/architecture.md, "Layers", draws it). A cycle
#    is reported with the edges that make it.
# 2. No source file over MAX_LINES lines, except those in ALLOW: files
#    already over when the rule came, each to be split and then taken off
#    the list (never added to it).
#
# Runs from the repository root, or from anywhere: it changes there.
set -u
cd "$(dirname "$0")/.." || exit 1

MAX_LINES=900
ALLOW=""

fail=0
dirs=$(find . -mindepth 2 -maxdepth 2 \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
         -not -path './tests/*' -printf '%h\n' | sed 's|^\./||' | sort -u)

# 1. The folder graph, one "from to" pair per line (tsort's input); each
#    folder also depends on itself so that folders without edges show up.
edges=$(for d in $dirs; do
  echo "$d $d"
  grep -ho '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./[A-Za-z0-9_]*/' \
       "$d"/*.c "$d"/*.h "$d"/*.cu "$d"/*.cuh 2>/dev/null |
    sed 's|.*"\.\./||; s|/$||' | sort -u | sed "s|^|$d |"
done)
echo "folder include graph (folder: folders it includes):"
for d in $dirs; do
  echo "  $d: $(echo "$edges" | awk -v d="$d" '$1 == d && $2 != d { printf "%s ", $2 }')"
done
# tsort lists a folder before those it includes; reversed, the bottom first.
if order=$(echo "$edges" | tsort 2>/tmp/layers.$$); then
  echo "layers, bottom first: $(echo "$order" | tac | tr '\n' ' ')"
else
  echo "FAIL: the folder include graph has a cycle:"
  sed 's/^/  /' /tmp/layers.$$
  fail=1
fi
rm -f /tmp/layers.$$

# 2. File lengths.
while read -r n f; do
  [ "$f" = total ] && continue
  if [ "$n" -gt "$MAX_LINES" ]; then
    if echo "$ALLOW" | grep -qx "$f"; then
      echo "allowed for now: $f has $n lines (over $MAX_LINES)"
    else
      echo "FAIL: $f has $n lines, over $MAX_LINES: split it by job"
      fail=1
    fi
  fi
done < <(for d in $dirs; do ls "$d"/*.c "$d"/*.h "$d"/*.cu "$d"/*.cuh 2>/dev/null; done |
         xargs wc -l)
# An allowed file that shrank under the limit (or went away) comes off the list.
for f in $ALLOW; do
  if [ ! -f "$f" ] || [ "$(wc -l <"$f")" -le "$MAX_LINES" ]; then
    echo "FAIL: $f is in ALLOW but no longer over $MAX_LINES lines: take it off the list"
    fail=1
  fi
done

[ "$fail" -eq 0 ] && echo "layers: ok"
exit "$fail"
