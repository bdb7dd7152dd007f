#!/usr/bin/env bash
# tools/device-run.sh - the GPU checks, run on the GPU machine from the
# repository root after tools/device-bundle.sh prepared .device/ here and
# the device tool carried it there:
#
#   run: tools/device-run.sh     (carry: .device/bin, .device/debs)
#
# It unpacks the Debian packages into a scratch root (dpkg -x, never into
# /), puts their libraries and redis-server on the paths, and runs, each
# step's output in $OUT/<step>.log and one line per step in
# $OUT/summary.txt:
#   - nvidia-smi, kinfer --version;
#   - the CUDA backend's tests (test_gpu_plan, test_gpu), and the CPU
#     model tests for comparison;
#   - the integration suite with every worker on the CUDA backend
#     (KINFER_TEST_BACKEND=cuda), the injected device fault included;
#   - test_gpu under compute-sanitizer (memcheck, racecheck), without its
#     deliberate illegal-address test;
#   - make demo's script with worker.backend=cuda;
#   - the text-jobs suite with every worker on the CUDA backend;
#   - kinfer bench gemm on the 768->3072->768 MLP in every precision and
#     at batch sizes up to 4096 (rows/s and TFLOP/s);
#   - kinfer bench encode on BERT-base- and MiniLM-shaped encoders at 128
#     tokens in every precision, graphs on and off, and PyTorch on the
#     same GPU and batches when the machine's python3 has torch with CUDA;
#   - generation: the CUDA primitives' and sampler's tests, the decoders
#     and the engine natively (test_cuda_prims, test_cuda_sample,
#     test_decoder, test_gen_engine), the generation suite with every
#     worker on the CUDA backend, and kinfer bench generate on a
#     Llama-1B-shaped bf16 folder at 1, 32 and 256 sequences (overlap on,
#     and one sequence with it off; sampled with temperature 0.7, top-k 50
#     and top-p 0.95 at 1 and 256, and with top-p alone at 1), with
#     transformers' generate() on the same GPU when the machine's python3
#     has it.
# STEPS="test_gpu demo" runs only the named steps. It stops nothing and
# fails nothing: read the summary.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kinfer-device-out}
mkdir -p "$OUT"
B=.device/bin
K=$B/kinfer
root=/tmp/kinfer-root
rm -rf "$root"
mkdir -p "$root"
for d in .device/debs/*.deb; do dpkg -x "$d" "$root"; done
arch=x86_64-linux-gnu
export LD_LIBRARY_PATH="$root/usr/lib/$arch:$root/lib/$arch:$root/usr/lib/$arch/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$root/usr/bin:$PATH"
# This machine has a GPU: a CUDA suite that finds no device fails here
# instead of exiting 77 (skipped), so the summary never shows a run that
# tested nothing as rc=0.
export KINFER_REQUIRE_GPU=1
: >"$OUT/summary.txt"

want() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
# step NAME CMD...: runs CMD, its output in NAME.log, and its exit status
# and duration on a line of the summary.
step() {
  local name=$1 t0 rc
  shift
  want "$name" || return 0
  echo "== $name"
  t0=$(date +%s)
  ("$@") >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log" | sed 's/^/   /'
}

step machine sh -c "nvidia-smi; $K --version; nvcc --version | tail -n1; uname -a"
step test_gpu_plan "$B/tests/test_gpu_plan"
step test_gpu "$B/tests/test_gpu"
step test_model "$B/tests/test_model"
step integration_cuda env KINFER_TEST_BACKEND=cuda KINFER_BIN="$K" "$B/tests/test_integration"
if command -v compute-sanitizer >/dev/null; then
  step memcheck env KINFER_TEST_NO_FAULT=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/tests/test_gpu"
  step racecheck env KINFER_TEST_NO_FAULT=1 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/tests/test_gpu"
fi
step text_jobs_cuda env KINFER_TEST_BACKEND=cuda KINFER_TEST_NO_TORCH=1 KINFER_BIN="$K" \
  "$B/tests/test_text_jobs"
step demo_cuda env KINFER_BIN="$K" DEMO_SETS="--set worker.backend=cuda" tests/demo.sh

gemm() {
  local work
  work=$(mktemp -d)
  "$K" model demo -o "$work/mlp.safetensors" --in 768 --hidden 3072 --out 768 --seed 2 >/dev/null
  cat >"$work/mlp.cfg" <<CFG
models = ( { name = "mlp"; path = "mlp.safetensors";
  layers = ( { op = "dense"; weight = "0.weight"; bias = "0.bias"; }, { op = "relu"; },
             { op = "dense"; weight = "2.weight"; bias = "2.bias"; } ); } );
worker = { backend = "cuda"; };
CFG
  for p in fp32 tf32 fp16 bf16; do
    for g in true false; do
      "$K" bench gemm -c "$work/mlp.cfg" --set gpu.precision="$p" --set gpu.graphs="$g" \
        --batch 1,8,32,128,1024,4096 --seconds 1 | sed "s/^gemm:/gemm: graphs=$g/"
    done
    "$K" bench gemm -c "$work/mlp.cfg" --set gpu.precision="$p" --batch 32,1024 --seconds 1 \
      --parallel 2 | sed 's/^gemm:/gemm: graphs=true/'
  done
}
step bench_gemm gemm

encode() {
  local work m p g tok=16384
  work=$(mktemp -d)
  "$K" model demo --kind bert -o "$work/bertbase" --layers 12 --hidden 768 --heads 12 \
    --intermediate 3072 --seed 4 >/dev/null
  "$K" model demo --kind bert -o "$work/minilm" --layers 6 --hidden 384 --heads 12 \
    --intermediate 1536 --seed 3 >/dev/null
  for m in bertbase minilm; do
    printf 'models = ( { name = "%s"; path = "%s"; } );\nworker = { backend = "cuda"; };\n' \
      "$m" "$m" >"$work/$m.cfg"
    for p in fp32 tf32 fp16 bf16; do
      for g in true false; do
        "$K" bench encode -c "$work/$m.cfg" --set gpu.precision="$p" --set gpu.graphs="$g" \
          --set batching.max_batch_tokens=$tok --set batching.max_batch_rows=$((tok / 128)) \
          --jobs 4096 --length 128 --seconds 2 --dump "$work/$m.jsonl" | sed "s/^encode:/encode: graphs=$g/"
      done
    done
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      for dt in float32 float16 bfloat16; do
        python3 bench/torch_encoder_bench.py "$work/$m" "$work/$m.jsonl" 1 2 cuda "$dt"
      done
    fi
  done
}
step bench_encode encode

step gen_prims sh -c "$B/tests/test_cuda_prims && $B/tests/test_cuda_sample"
step gen_decoder "$B/tests/test_decoder"
step gen_engine env KINFER_TEST_BACKEND=cuda "$B/tests/test_gen_engine"
step gen_jobs_cuda env KINFER_TEST_BACKEND=cuda KINFER_BIN="$K" "$B/tests/test_gen_jobs"

generate() {
  local work
  work=$(mktemp -d)
  "$K" model demo --kind llama -o "$work/llama1b" --layers 16 --hidden 2048 --heads 32 \
    --kv-heads 8 --intermediate 8192 --vocab 128256 --dtype bf16 >/dev/null
  "$K" bench generate -c worker.cfg --model "$work/llama1b" --batch 1,32,256 --length 128 \
    --steps 64 --set worker.backend=cuda --set gpu.precision=bf16
  "$K" bench generate -c worker.cfg --model "$work/llama1b" --batch 1 --length 128 \
    --steps 64 --set worker.backend=cuda --set gpu.precision=bf16 --set generation.overlap=false
  "$K" bench generate -c worker.cfg --model "$work/llama1b" --batch 1,256 --length 128 \
    --steps 64 --set worker.backend=cuda --set gpu.precision=bf16 --sampling 0.7,50,0.95
  "$K" bench generate -c worker.cfg --model "$work/llama1b" --batch 1 --length 128 \
    --steps 64 --set worker.backend=cuda --set gpu.precision=bf16 --sampling 1,0,0.95
  if python3 -c 'import torch, transformers, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
      2>/dev/null; then
    python3 bench/hf_generate_bench.py "$work/llama1b" 128 64 1,32,256
  fi
}
step bench_generate generate
echo "device-run: summary in $OUT/summary.txt"
cat "$OUT/summary.txt"
