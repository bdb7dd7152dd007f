#!/usr/bin/env bash
# emu_bugs.sh - proof that the emulated device catches the CUDA backend's
# bugs. Copies the sources and the build's objects to a temporary folder
# (the tree is never modified), checks that the unmodified copy's
# test_cuda_prims passes on the emulated device, then plants one bug at a
# time in the copy, rebuilds only what it touches, and checks that the
# test case that covers it fails:
#   kernel-index  gpu/cuda_kernels.cu: l2norm's last loop stops one short
#                 (i + 1 < w), the row's last element is never scaled;
#                 caught by test_rowwise.
#   no-barrier    gpu/cuda_kernels.cu: block_reduce reads the warps'
#                 partial sums from shared memory without the
#                 __syncthreads() that waits for them to be written;
#                 caught by test_norms.
#   gemm-ld       gpu/cuda_lt.c: the activations' cuBLASLt layout gets k
#                 as its leading dimension instead of lda; caught by
#                 test_gemm (padded leading dimensions).
#   capture-alloc gpu/cuda_lt.c: a cudaMalloc in the GEMM, which runs
#                 inside graph capture; caught by test_graphs.
#   gemm-barrier  gpu/cuda_kernels.cu: the fallback GEMM loads the next
#                 tiles of A and B without the __syncthreads() that waits
#                 for every thread to be done with the last ones; caught
#                 by test_gemm_fallback (the emulated cuBLASLt refusing).
# Each bug is planted by replacing an exact anchor text that must occur
# exactly once: if the source changes and the anchor disappears, this
# script fails (it never passes without planting its bug).
#
# Exits 77 (skipped) without CUDA's headers (no emulated device to
# build), like the emulated tests in make test. $KINFER_BIN's folder is
# the build tree whose objects the copy starts from (build by default).
# Runs the relevant cases only: about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$CUDA_HOME/include/cublasLt.h" ]; then
  echo "emu_bugs: skipped: no CUDA headers under $CUDA_HOME (no emulated device)"
  exit 77
fi
B=$(dirname "${KINFER_BIN:-build/kinfer}")
prog=$B/emu/tests/test_cuda_prims
work=$(mktemp -d /tmp/kinfer-emu-bugs-XXXXXX)
[ -n "${KINFER_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

# The copy: sources with their times, and the objects and dependency files
# of the build tree, so that make rebuilds only what a bug touches.
cp -a Makefile base codecs config kafka gpu batching text gen worker telemetry tools cmd emu tests \
  "$work/"
mkdir -p "$work/$B"
(cd "$root" && find "$B" \( -name '*.o' -o -name '*.d' \) -print0 |
  xargs -0 cp -a --parents -t "$work")

build() {
  if ! make -C "$work" --no-print-directory -s B="$B" WERROR= "$prog" >"$work/make.log" 2>&1; then
    echo "emu_bugs: FAILED: the copy does not build:"; tail -20 "$work/make.log"; exit 1
  fi
}

# run CASE: the emulated test_cuda_prims with only CASE; prints its
# output's last lines, returns its status.
run() {
  local rc=0
  (cd "$work" && KINFER_TEST_FILTER="$1" "$prog") >"$work/run.log" 2>&1 || rc=$?
  { grep -m2 -E '^ERROR:|^\[  ERROR   \] --- [^[]|^\[   LINE' "$work/run.log" || true; tail -1 "$work/run.log"; } |
    cut -c1-200 | sed 's/^/    /'
  return $rc
}

# plant FILE ANCHOR REPLACEMENT: replaces the anchor, which must occur
# exactly once in the copy's FILE.
plant() {
  python3 - "$work/$1" "$2" "$3" <<'EOF'
import sys
path, anchor, repl = sys.argv[1:4]
src = open(path, encoding="utf-8").read()
n = src.count(anchor)
if n != 1:
    sys.exit("emu_bugs: anchor found %d times in %s (want 1): %r" % (n, path, anchor))
open(path, "w", encoding="utf-8").write(src.replace(anchor, repl))
EOF
}

fails=0
echo "emu_bugs: the unmodified copy"
build
for c in test_rowwise test_norms test_gemm test_graphs test_gemm_fallback; do
  if run "$c"; then echo "  $c passes, as it should"
  else echo "  FAILED: $c fails on the unmodified sources"; fails=$((fails + 1)); fi
done

# mutant NAME FILE OBJECT CASE ANCHOR REPLACEMENT
mutant() {
  local name=$1 file=$2 obj=$3 case=$4 anchor=$5 repl=$6
  echo "emu_bugs: $name ($file), expecting $case to fail"
  cp -a "$work/$file" "$work/$file.orig"
  cp -a "$work/$obj" "$work/$obj.orig"
  plant "$file" "$anchor" "$repl" || { fails=$((fails + 1)); return; }
  build
  local rc=0
  run "$case" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then echo "  caught (exit $rc)"
  else echo "  FAILED: $name not caught (exit $rc)"; fails=$((fails + 1)); fi
  # Back to the unmodified file and object, times included.
  mv -f "$work/$file.orig" "$work/$file"
  mv -f "$work/$obj.orig" "$work/$obj"
}

K=gpu/cuda_kernels.cu KO=$B/emu/gpu/cuda_kernels.emu.o
L=gpu/cuda_lt.c LO=$B/emu/gpu/cuda_lt.o
mutant kernel-index "$K" "$KO" test_rowwise \
  '    float inv = 1.0f / fmaxf(norm, 1e-12f);
    for (size_t i = threadIdx.x; i < w; i += blockDim.x)' \
  '    float inv = 1.0f / fmaxf(norm, 1e-12f);
    for (size_t i = threadIdx.x; i + 1 < w; i += blockDim.x)'
mutant no-barrier "$K" "$KO" test_norms \
  '    if (lane == 0) shared[warp] = v;
    __syncthreads();' \
  '    if (lane == 0) shared[warp] = v;'
mutant gemm-ld "$L" "$LO" test_gemm \
  '(int64_t)k->lda, batch, k->sa)' \
  '(int64_t)k->k, batch, k->sa)'
mutant capture-alloc "$L" "$LO" test_graphs \
  '    size_t batch = g->batch ? g->batch : 1;
    size_t lda =' \
  '    size_t batch = g->batch ? g->batch : 1;
    void *scratch = NULL;
    if (cudaMalloc(&scratch, 256) != cudaSuccess) return cx_refuse(c, "gemm: no scratch");
    (void)cudaFree(scratch);
    size_t lda ='
mutant gemm-barrier "$K" "$KO" test_gemm_fallback \
  '                    for (int q = 0; q < kTile; q++) acc += as[ty][q] * bs[q][tx];
                    __syncthreads();' \
  '                    for (int q = 0; q < kTile; q++) acc += as[ty][q] * bs[q][tx];'

if [ "$fails" -ne 0 ]; then echo "emu_bugs: $fails check(s) FAILED"; exit 1; fi
echo "emu_bugs: every planted bug was caught, and the unmodified copy passes"
