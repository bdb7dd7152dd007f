#!/usr/bin/env bash
# tools/device-bundle.sh - prepares a run on a GPU machine that has CUDA
# but none of kinfer's libraries and no network (the device tool's
# machines). Run it here, from the repository root; it needs Debian's
# package archive and nvcc.
#
#   1. builds kinfer and its test programs with CUDA in .device/build
#      (make B=.device/build) and copies them, stripped, to .device/bin:
#      the binaries the device will run;
#   2. finds every shared library those binaries and redis-server load
#      (ldd), the Debian packages that hold them (dpkg -S), and downloads
#      those packages, plus redis-server and redis-tools themselves, with
#      apt-get download into .device/debs. glibc, libgcc and libstdc++ are
#      the device's own (newer), and CUDA's libraries are the device's.
#
# .device/ is git-ignored; the device tool carries .device/bin and
# .device/debs (`carry`), which must stay under its 64 MiB with the
# repository. tools/device-run.sh
# unpacks the packages there and runs the GPU checks. Nothing here runs
# on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.device
mkdir -p "$dest/debs"
B=$dest/build

echo "== building with CUDA into $B"
[ -x /usr/local/cuda/bin/nvcc ] || { echo "device-bundle: nvcc not found under /usr/local/cuda" >&2; exit 1; }
make deps >/dev/null
tests=$(ls tests/test_*.c | sed "s#tests/\(.*\)\.c#$B/tests/\1#")
make -s WERROR=1 B="$B" "$B/kinfer" $tests
"$B/kinfer" --version
rm -rf "$dest/bin"
mkdir -p "$dest/bin/tests"
install -s "$B/kinfer" "$dest/bin/kinfer"
for t in $tests; do install -s "$t" "$dest/bin/tests/"; done

echo "== the Debian packages of every library the binaries and redis-server load"
command -v redis-server >/dev/null || { echo "device-bundle: redis-server missing (make deps installs it)" >&2; exit 1; }
libs=$(for b in "$B/kinfer" $tests "$(command -v redis-server)" "$(command -v redis-cli)"; do
         ldd "$b" | awk '/=> \// { print $3 }'
       done | sort -u)
pkgs="redis-server redis-tools"
for l in $libs; do
  case "$l" in /usr/local/cuda*) continue ;; esac
  p=$(dpkg -S "$l" 2>/dev/null || dpkg -S "$(readlink -f "$l")" 2>/dev/null || true)
  p=${p%%:*}
  case "$p" in ""|libc6|libgcc-s1|libstdc++6) continue ;; esac
  pkgs="$pkgs $p"
done
pkgs=$(printf '%s\n' $pkgs | sort -u | paste -sd' ' -)
echo "   $pkgs"

echo "== apt-get download into $dest/debs"
rm -f "$dest/debs"/*.deb
(cd "$dest/debs" && apt-get download $pkgs >/dev/null)
ls "$dest/debs" | sed 's/^/   /'
du -sh "$dest/debs" "$dest/bin" | sed 's/^/   /'
echo "device-bundle: done; carry .device/bin and .device/debs, run tools/device-run.sh there"
