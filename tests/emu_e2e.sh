#!/usr/bin/env bash
# emu_e2e.sh - the worker end to end on the emulated device: build/emu/kinfer
# (make emu) with worker.backend = "cuda", whose CUDA backend, cuBLASLt and
# kernels run on the host (docs/gpu.md).
#
# 1. The text-jobs suite (test_text_jobs) against it: the same jobs,
#    checks and CPU reference as its run on the CPU backend, only the
#    workers run build/emu/kinfer on the emulated device (longer waits:
#    the emulation is slow).
# 2. The generation suite (test_gen_jobs) likewise: prompts and chats in
#    both encodings, streams, hostile jobs, kill -9 mid-generation, and a
#    device fault (a sticky illegal address on the emulated device) that
#    must stop the worker with nothing lost.
# 3. `kinfer smoke` against one such worker on two emulated devices
#    (KINFER_EMU_DEVICES=2), in a folder of its own with worker.cfg and the
#    demo models: every job must come back ok (dense, text and
#    generation), both devices' generator lanes must have generated (their
#    generator_stopped lines at the end), and every report must name the
#    device as emulated: the worker's startup log (event=backend_selected
#    device=...), /readyz
#    ("device"), kinfer_backend_info's device label, the heartbeat as
#    `kinfer status` shows it, and smoke's own summary.
#
# Exits 77 (skipped) without CUDA's headers (no emulated device to build),
# as the emulated tests in make test. $KINFER_BIN's folder is the build
# tree (build by default); its emu/kinfer, tests/test_text_jobs and tests/test_gen_jobs must be
# built (make test builds them).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$CUDA_HOME/include/cublasLt.h" ]; then
  echo "emu_e2e: skipped: no CUDA headers under $CUDA_HOME (no emulated device)"
  exit 77
fi
B=$(dirname "${KINFER_BIN:-build/kinfer}")
EK=$root/$B/emu/kinfer
for f in "$EK" "$B/tests/test_text_jobs" "$B/tests/test_gen_jobs"; do
  [ -x "$f" ] || { echo "emu_e2e: FAILED: $f is not built"; exit 1; }
done

echo "== emu_e2e: test_text_jobs, workers on $B/emu/kinfer, worker.backend = cuda"
KINFER_BIN=$EK KINFER_TEST_BACKEND=cuda KINFER_TEST_WAIT_S=${KINFER_TEST_WAIT_S:-400} \
  "$B/tests/test_text_jobs"

echo "== emu_e2e: test_gen_jobs, workers on $B/emu/kinfer, worker.backend = cuda"
KINFER_BIN=$EK KINFER_TEST_BACKEND=cuda KINFER_TEST_WAIT_S=${KINFER_TEST_WAIT_S:-400} \
  "$B/tests/test_gen_jobs"

echo "== emu_e2e: kinfer smoke against a worker on the emulated device"
work=$(mktemp -d /tmp/kinfer-emu-e2e-XXXXXX)
pids=()
fail() { echo "emu_e2e: FAILED: $*"; echo "   logs: $work"; exit 1; }
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# worker.cfg's relative model paths resolve in the work folder.
cp worker.cfg "$work/"
cd "$work"
mkdir -p models
"$EK" model demo -o models/demo.safetensors --in 16 --hidden 32 --out 8 >/dev/null
"$EK" model demo --kind bert -o models/text-demo --hidden 32 >/dev/null
"$EK" model demo --kind roberta -o models/roberta-demo --hidden 32 >/dev/null
"$EK" model demo --kind llama -o models/llama-demo --hidden 32 >/dev/null

"$EK" broker --partitions 2 --topics jobs,results,jobs.dlq >broker.out 2>broker.log &
pids+=($!)
for _ in $(seq 100); do [ -s broker.out ] && break; sleep 0.05; done
brokers=$(head -n1 broker.out)
[ -n "$brokers" ] || fail "the broker did not start"
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  >redis.log 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
mport=$(free_port)
sets=(--set "kafka.brokers=$brokers" --set "redis.port=$rport" --set kafka.properties.fetch.wait.max.ms=10
      --set "metrics.listen=127.0.0.1:$mport" --set kafka.group=emu-e2e)
KINFER_EMU_DEVICES=2 "$EK" worker -c worker.cfg "${sets[@]}" --set worker.backend=cuda \
  2>worker.log &
wpid=$!
pids+=($wpid)
for _ in $(seq 1200); do
  grep -q 'event=partitions_assigned' worker.log && break
  kill -0 "$wpid" 2>/dev/null || break
  sleep 0.05
done
grep -q 'event=partitions_assigned' worker.log || { tail worker.log; fail "the worker did not join"; }

# The startup log names the emulated device.
sel=$(grep 'event=backend_selected' worker.log || true)
echo "   $sel"
case "$sel" in *'backend=cuda device="emulated '*) ;; *) fail "backend_selected names no emulated device";; esac

status=0
"$EK" smoke -c worker.cfg "${sets[@]}" --jobs 40 --rate 200 --json-every 5 --timeout 300 \
  >smoke.out 2>smoke.err || status=$?
"$EK" smoke -c worker.cfg "${sets[@]}" --model text-demo --jobs 20 --rows 2 --rate 100 \
  --json-every 5 --timeout 300 >>smoke.out 2>>smoke.err || status=$?
"$EK" smoke -c worker.cfg "${sets[@]}" --model llama-demo --jobs 10 --rate 50 \
  --json-every 5 --timeout 300 >>smoke.out 2>>smoke.err || status=$?
sed 's/^/   /' smoke.out
[ "$status" -eq 0 ] || { cat smoke.err; fail "kinfer smoke exited $status"; }
grep -q '^kinfer smoke: jobs=40 results=40 ok=40 wrong=0 missing=0$' smoke.out ||
  fail "not every dense job came back ok"
grep -q '^kinfer smoke: jobs=20 results=20 ok=20 wrong=0 missing=0$' smoke.out ||
  fail "not every text job came back ok"
grep -q '^kinfer smoke: jobs=10 results=10 ok=10 wrong=0 missing=0 ' smoke.out ||
  fail "not every generation job came back ok"
[ "$(grep -c '^kinfer smoke: the worker ran them on backend=cuda device=emulated ' smoke.out)" -eq 3 ] ||
  fail "smoke's summary does not name the emulated device"

# /readyz, the metrics and the heartbeat (kinfer status) say so too.
ready=$(curl -s "http://127.0.0.1:$mport/readyz")
echo "   /readyz: $ready"
case "$ready" in *'"backend":"cuda","device":"emulated '*) ;; *) fail "/readyz names no emulated device";; esac
info=$(curl -s "http://127.0.0.1:$mport/metrics" | grep '^kinfer_backend_info' || true)
echo "   $info"
case "$info" in *'device="emulated '*) ;; *) fail "kinfer_backend_info names no emulated device";; esac
st=""
for _ in $(seq 100); do
  st=$("$EK" status -c worker.cfg "${sets[@]}" 2>&1 || true)
  case "$st" in *emulated*) break;; esac
  sleep 0.1
done
echo "$st" | sed 's/^/   /'
case "$st" in *"cuda "*"emulated NVIDIA"*) ;; *) fail "kinfer status names no emulated device";; esac

kill -TERM "$wpid"
wait "$wpid" || fail "the worker exited $? on SIGTERM"
# one generator lane a device, each having run steps of its own
for lane in 0 1; do
  gl=$(grep "event=generator_stopped .*lane=$lane " worker.log || true)
  echo "   $gl"
  case "$gl" in *' steps=0 '*|'') fail "generator lane $lane ran no step";; esac
done
echo "emu_e2e: the emulated device ran every job, and every report names it"
