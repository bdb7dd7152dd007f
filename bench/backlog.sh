#!/usr/bin/env bash
# bench/backlog.sh: a worker draining a backlog of big jobs, with the
# default queue and with a small one (docs/batching.md, "A small queue and
# big jobs"). Not a test: it prints one line per setting and the ratio.
#
# For each setting: a fresh `kinfer broker` (PARTITIONS partitions) and an
# empty redis-server, the demo model (64 -> 128 -> 16); JOBS jobs of ROWS
# rows each are produced first, so the whole backlog waits in Kafka; then
# a worker on worker.cfg with fetch.wait.max.ms=10 (the embedded broker
# needs it) plus the setting's --set arguments drains it. The jobs are
# produced with zstd compression: the embedded broker keeps at most ~5 MB
# per partition (it deletes the oldest records beyond that), which would
# hold only ~1,200 of these 16 KB jobs on 4 partitions; jobs cut from a
# small pool of random rows compress about 30 times, so 20,000 of them fit.
# The worker decompresses and decodes every job as usual. Throughput is
# `bench collect --from dbsize` (results in Redis, 10%-90% of them);
# memory is the worker's peak RSS (VmHWM); pauses are its `paused` debug
# lines.
#
#   bench/backlog.sh                        # both settings below
#   SETTINGS="max128=--set batching.max_queued_rows=128 --set batching.max_job_rows=64" \
#     JOBS=5000 bench/backlog.sh             # one of them, a shorter run
#   WORKER_BIN=/path/to/other/kinfer WORKER_CFG=/path/to/its/worker.cfg \
#     bench/backlog.sh                       # another build's worker
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KINFER_BIN:-build/kinfer}
W=${WORKER_BIN:-$K}             # the worker under test; the tools are $K's
CFG=${WORKER_CFG:-worker.cfg}   # that worker's worker.cfg
JOBS=${JOBS:-20000}
ROWS=${ROWS:-64}
PARTITIONS=${PARTITIONS:-4}
# name=--set arguments, one setting per entry, separated by '|'.
SETTINGS=${SETTINGS:-"default=|max128=--set batching.max_queued_rows=128 --set batching.max_job_rows=64"}

work=$(mktemp -d /tmp/kinfer-backlog-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2" | head -n1; }

$K model demo -o "$work/demo.safetensors" --in 64 --hidden 128 --out 16 >/dev/null
# worker.cfg's other models too (their paths are relative to the config's
# folder): a worker loads every model its config names.
mkdir -p "$work/models"
$K model demo --kind bert -o "$work/models/text-demo" >/dev/null
$K model demo --kind roberta -o "$work/models/roberta-demo" >/dev/null
$K model demo --kind llama -o "$work/models/llama-demo" >/dev/null
sed "s#models/demo.safetensors#$work/demo.safetensors#" "$CFG" >"$work/worker.cfg"

declare -A rate
IFS='|' read -ra settings <<<"$SETTINGS"
for entry in "${settings[@]}"; do
  name=${entry%%=*}
  read -ra sets <<<"${entry#*=}"
  $K broker --partitions "$PARTITIONS" --topics jobs,results,jobs.dlq >"$work/$name.broker.out" \
    2>"$work/$name.broker.log" &
  bpid=$!
  pids+=($bpid)
  for _ in $(seq 100); do [ -s "$work/$name.broker.out" ] && break; sleep 0.05; done
  brokers=$(head -n1 "$work/$name.broker.out")
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    >"$work/$name.redis.log" 2>&1 &
  rpid=$!
  pids+=($rpid)
  for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
  common=(-c "$work/worker.cfg" --set "kafka.brokers=$brokers" --set "redis.port=$rport"
          --set kafka.properties.fetch.wait.max.ms=10)
  $K bench produce "${common[@]}" --set kafka.properties.compression.type=zstd --rate 0 \
    --jobs "$JOBS" --rows "$ROWS" --run "$name" >"$work/$name.produce.out"
  $K bench collect "${common[@]}" --from dbsize --no-fetch --jobs "$JOBS" --run "$name" \
    --timeout 1800 >"$work/$name.collect.out" &
  cpid=$!
  for _ in $(seq 200); do grep -q 'collect: ready' "$work/$name.collect.out" 2>/dev/null && break; sleep 0.05; done
  $W worker "${common[@]}" --set metrics.listen= --set log.level=debug "${sets[@]}" \
    2>"$work/$name.worker.log" &
  wpid=$!
  pids+=($wpid)
  wait "$cpid" || { echo "backlog: $name: not every result came:" >&2; tail -5 "$work/$name.worker.log" >&2; exit 1; }
  col=$(grep '^collect:' "$work/$name.collect.out")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$wpid/status")
  kill -TERM "$wpid"; wait "$wpid" || true
  kill -TERM "$bpid" "$rpid"; wait "$bpid" "$rpid" 2>/dev/null || true
  pauses=$(grep -c 'event=paused' "$work/$name.worker.log" || true)
  rate[$name]=$(kv per_s "$col")
  echo "backlog: setting=$name sets=\"${sets[*]}\" jobs=$JOBS rows=$ROWS partitions=$PARTITIONS" \
       "jobs_per_s=${rate[$name]} got=$(kv got "$col") span_s=$(kv span_s "$col")" \
       "peak_rss_kb=$hwm pauses=$pauses"
done
if [ -n "${rate[default]:-}" ] && [ -n "${rate[max128]:-}" ]; then
  python3 -c "print('backlog: max128/default = %.2f' % (float('${rate[max128]}') / float('${rate[default]}')))"
fi
[ -n "${KEEP:-}" ] || rm -rf "$work"
