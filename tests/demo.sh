#!/usr/bin/env bash
# make demo: the worker end to end on its embedded defaults. Starts kinfer's
# dev broker and a local redis-server on free ports, writes the demo models
# (an MLP, a BERT folder, a RoBERTa folder with its BPE tokenizer, a random
# Llama folder that generates text), runs the worker on worker.cfg (pointed
# at them with --set), sends a few hundred jobs with `kinfer smoke`, which
# waits for every result in Redis, checks it and prints the summary, then
# stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KINFER_BIN:-build/kinfer}
# DEMO_SETS: more --set arguments for the worker, e.g. on a GPU machine
# DEMO_SETS="--set worker.backend=cuda --set gpu.precision=bf16".
read -ra demo_sets <<<"${DEMO_SETS:-}"
JOBS=${JOBS:-400}
work=$(mktemp -d /tmp/kinfer-demo-XXXXXX)
pids=()
# Everything started is stopped; the scratch directory (logs, redis's
# dir) goes too unless the demo failed (then its path is printed) or
# KEEP_DEMO_LOGS=1.
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" = 0 ] && [ "${KEEP_DEMO_LOGS:-0}" != 1 ]; then rm -rf "$work"
  else echo "   logs kept in $work"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
  || shuf -i 20000-60000 -n 1; }

echo "== demo models"
$K model demo -o models/demo.safetensors --in 64 --hidden 128 --out 16
$K model demo --kind bert -o models/text-demo
$K model demo --kind roberta -o models/roberta-demo
$K model demo --kind llama -o models/llama-demo

echo "== kinfer broker (librdkafka mock cluster, its own process)"
$K broker --partitions 4 --topics jobs,results,jobs.dlq >"$work/broker.out" 2>"$work/broker.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/broker.out" ] && break; sleep 0.05; done
brokers=$(head -n1 "$work/broker.out")
echo "   bootstrap: $brokers"

echo "== redis-server"
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
echo "   127.0.0.1:$rport"

mport=$(free_port)
set_args=(--set "kafka.brokers=$brokers" --set "redis.port=$rport" --set kafka.properties.fetch.wait.max.ms=10
          --set kafka.properties.session.timeout.ms=4000 --set kafka.properties.heartbeat.interval.ms=500
          --set "metrics.listen=127.0.0.1:$mport")
echo "== kinfer worker -c worker.cfg ${set_args[*]}"
$K worker -c worker.cfg "${set_args[@]}" "${demo_sets[@]}" 2>"$work/worker.log" &
wpid=$!
pids+=($wpid)

# Wait until the worker has joined the group and owns the partitions, so
# the latency printed below is the worker's, not the group join's.
for _ in $(seq 600); do
  grep -q 'event=partitions_assigned' "$work/worker.log" && break
  kill -0 "$wpid" 2>/dev/null || break   # it could not start: say why at once
  sleep 0.05
done
grep -q 'event=partitions_assigned' "$work/worker.log" || { echo "worker did not join the group:"; tail "$work/worker.log"; exit 1; }

# readyz: prints /readyz's status and body on one line.
readyz() { curl -s -w ' %{http_code}' "http://127.0.0.1:$mport/readyz" 2>/dev/null | tr -d '\n' \
  | sed -E 's/^(.*) ([0-9]{3})$/\2 \1/' || true; }
# Readiness follows the real state (it does not wait for librdkafka's
# first statistics): a joined worker is ready within moments.
for _ in $(seq 100); do [ "$(readyz | cut -c1-3)" = 200 ] && break; sleep 0.1; done
echo "   /readyz: $(readyz)"

RATE=${RATE:-400}
echo "== kinfer smoke: $JOBS jobs at $RATE/s (every 5th as JSON), every result checked against the model"
status=0
$K smoke -c worker.cfg "${set_args[@]}" "${demo_sets[@]}" --jobs "$JOBS" --rate "$RATE" --json-every 5 --timeout 120 || status=$?

TEXT_JOBS=${TEXT_JOBS:-100}
echo "== kinfer smoke --model text-demo: $TEXT_JOBS text jobs of 2 rows each, every result checked against the encoder"
$K smoke -c worker.cfg "${set_args[@]}" "${demo_sets[@]}" --model text-demo --jobs "$TEXT_JOBS" --rows 2 --rate 100 \
  --json-every 5 --timeout 120 || status=$?

ROBERTA_JOBS=${ROBERTA_JOBS:-40}
echo "== kinfer smoke --model roberta-demo: $ROBERTA_JOBS text jobs of 2 rows each (RoBERTa, byte-level BPE)"
$K smoke -c worker.cfg "${set_args[@]}" "${demo_sets[@]}" --model roberta-demo --jobs "$ROBERTA_JOBS" --rows 2 --rate 100 \
  --json-every 5 --timeout 120 || status=$?

GEN_JOBS=${GEN_JOBS:-40}
echo "== kinfer smoke --model llama-demo: $GEN_JOBS generation jobs (prompts and chats, some streamed with"
echo "   stop strings), every result checked against the contract; random weights: the text is gibberish"
$K smoke -c worker.cfg "${set_args[@]}" "${demo_sets[@]}" --model llama-demo --jobs "$GEN_JOBS" --rate 50 \
  --json-every 5 --timeout 120 || status=$?

echo "== a few of its metrics (http://127.0.0.1:$mport/metrics)"
curl -s "http://127.0.0.1:$mport/metrics" | grep -E '^kinfer_(jobs_total|batches_total|queue_depth_rows|rows_per_second|tokens_total|padding_ratio|gen_generated_tokens_total)[{ ]' \
  | awk '!/[{]/ || $NF != 0' | sed 's/^/   /' || true   # labelled series: the non-zero ones
echo "   /readyz: $(readyz)"

echo "== stopping the worker (SIGTERM: drain, flush, commit)"
kill -TERM "$wpid"
wait "$wpid" && echo "   worker exited 0" || { echo "   worker exited $?"; status=1; }
grep -E 'event=(worker_started|stopped)' "$work/worker.log" | sed 's/^/   /' || true
exit $status
