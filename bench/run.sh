#!/usr/bin/env bash
# make bench: measures kinfer against its floors in one run and prints one
# table (docs/benchmarks.md explains every row and method).
#
# Starts kinfer's embedded broker (librdkafka's mock cluster) and a local
# redis-server on free ports, writes two models (tiny 768->16->768, whose
# compute is negligible, and the 768->3072->768 MLP), then, all on this
# machine and in this order:
#   1. floors: librdkafka produce + consume, pipelined and plain Redis SET,
#      of the same job records the load uses (3.1 KB: 768 float32 + id);
#   2. the passthrough floor (consume -> produce + SET, nothing else) and
#      kinfer on the tiny model, each draining the same backlog (ROUNDS
#      times, the best kept);
#   3. kinfer on the MLP draining a backlog (likewise), then the MLP's
#      forward pass alone at the batch size kinfer reached;
#   4. latency from record timestamp to result in Redis at fractions of the
#      MLP's saturation rate, for two batching.max_wait_ms settings;
#   5. on a machine with a usable CUDA device (or BENCH_GPU=1): the MLP's
#      forward pass alone on the GPU per precision and batch size (rows/s,
#      TFLOP/s, % of the device's dense peak), and kinfer's saturation on
#      the GPU for the tiny model and the MLP as ratios to the passthrough
#      floor, with the device's busy ratio; BERT-base- and MiniLM-shaped
#      encoders at 128 tokens per precision and token budget (and PyTorch
#      on the same GPU and batches, when its torch has CUDA), and kinfer
#      end to end on text jobs on the GPU;
#   6. a text encoder, MiniLM-L6-shaped (6 layers, hidden 384, 12 heads,
#      random weights), on texts of mixed lengths: its forward pass alone
#      and PyTorch's (Debian's python3-torch) on the very same batches with
#      the same threads; the same in worker.cpu_precision "bf16", and a
#      BERT-base-shaped encoder in both, against PyTorch in float32 and
#      bfloat16; and kinfer end to end draining a backlog of text
#      jobs, with batching.group_by_length on and off (the padding ratio
#      of the batches each formed);
#   7. text generation on the CPU, SmolLM2-135M-shaped random Llama
#      folders (30 layers, hidden 576, 9 heads, 3 key/value heads,
#      intermediate 1536, vocabulary 49,152) in F32 and BF16: prefill
#      tokens/s and decode tokens/s at 1 and 32 sequences (`kinfer bench
#      generate`), PyTorch's loop with a key/value cache on the same
#      folder, ids and threads (bench/torch_decoder_bench.py), and the
#      decode bound the machine's read bandwidth sets;
#   8. with a GPU (as 5): generation of a Llama-1B-shaped random folder in
#      bf16 on the device, prefill and decode at 1, 32 and 256 sequences,
#      against the device's peak memory bandwidth and transformers'
#      generate() on the same GPU (bench/hf_generate_bench.py, when
#      $GPU_PYTHON has torch with CUDA and transformers);
# then prints the table, draws docs/bench-latency.png with gnuplot and
# writes the results into docs/benchmarks.md (between its bench markers).
#
# Every worker runs worker.cfg's defaults; the only overrides are
# fetch.wait.max.ms, which the embedded broker needs (README, "The
# embedded broker and latency"; 10 ms, 2 ms in the latency runs), linger.ms=1
# in the latency runs (LAT_PROPS), metrics.listen (a free port: another
# worker on the machine may hold worker.cfg's), and WORKER_SETS when given. Sizes can be changed from the
# environment (see the defaults below); the defaults keep the whole run
# within a few minutes on 2 cores. Nothing here is a pass/fail test.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KINFER_BIN:-build/bench/kinfer}
OUT=${BENCH_OUT:-build/bench/out}
PARTITIONS=${PARTITIONS:-64}       # backlog topics: the mock keeps ~5 MB per partition
LAT_PARTITIONS=${LAT_PARTITIONS:-8} # latency topics (see "a second broker" below)
N_FLOOR=${N_FLOOR:-60000}          # records for the Kafka floors
N_REDIS=${N_REDIS:-60000}          # SETs for the Redis floors
N_TINY=${N_TINY:-60000}            # backlog for the passthrough and kinfer-tiny
N_MLP=${N_MLP:-20000}              # backlog for kinfer-MLP
ROUNDS=${ROUNDS:-2}                # saturation runs of each kind; the best is kept
LAT_S=${LAT_S:-8}                  # seconds of load per latency point
LOADS=${LOADS:-"0.1 0.25 0.5 0.75 0.9"}   # fractions of MLP saturation
WAITS=${WAITS:-"2 10"}             # batching.max_wait_ms settings compared
UPDATE_DOCS=${UPDATE_DOCS:-1}      # write docs/benchmarks.md and the PNG
WORKER_SETS=${WORKER_SETS:-}       # extra "--set K=V ..." for every worker (A/B runs)
# librdkafka properties of the latency runs (worker, passthrough floor and
# load producer alike): the embedded broker answers a fetch only when
# fetch.wait.max.ms has passed, data or not, where a real broker answers
# as data arrives, so a short wait stands in for that; linger.ms=1 is what
# a latency-minded producer sets.
LAT_PROPS=${LAT_PROPS:-'( "fetch.wait.max.ms", "2" ), ( "linger.ms", "1" )'}
# GPU rows (section 5): auto = when `kinfer --version` reports a usable
# device; 1 = always (BENCH_GPU_BACKEND=cpu then runs the rows' logic on the
# CPU, to check the script); 0 = never.
BENCH_GPU=${BENCH_GPU:-auto}
BENCH_GPU_BACKEND=${BENCH_GPU_BACKEND:-cuda}
GPU_PRECISIONS=${GPU_PRECISIONS:-"fp32 tf32 fp16 bf16"}
GPU_BATCHES=${GPU_BATCHES:-1,32,128,1024,4096}
N_GPU=${N_GPU:-$N_MLP}             # backlog for kinfer on the GPU
BENCH_ENC=${BENCH_ENC:-1}          # 0 = skip the encoder rows (section 6)
N_ENC=${N_ENC:-1500}               # text jobs for kinfer end to end on the encoder
ENC_SEQS=${ENC_SEQS:-512}          # sequences of the forward-pass-alone runs
ENC_SECONDS=${ENC_SECONDS:-3}      # at least this long per forward-pass-alone run
ENC_BERT_SEQS=${ENC_BERT_SEQS:-128} # sequences of the BERT-base-shaped runs
GPU_ENC_TOKENS=${GPU_ENC_TOKENS:-"4096 16384"} # batching.max_batch_tokens of the GPU encoder rows
GPU_ENC_SEQS=${GPU_ENC_SEQS:-2048} # sequences of the GPU encoder rows
GPU_PYTHON=${GPU_PYTHON:-python3}  # a Python whose torch has CUDA, for the GPU comparison
BENCH_GEN=${BENCH_GEN:-1}          # 0 = skip the generation rows (section 7)
GEN_PROMPT=${GEN_PROMPT:-64}       # prompt tokens per sequence
GEN_STEPS=${GEN_STEPS:-64}         # decode steps per run
GEN_BATCHES=${GEN_BATCHES:-1,32}   # concurrent sequences of the decode rows
GPU_GEN_BATCHES=${GPU_GEN_BATCHES:-1,32,256} # the same on the GPU (section 8)
GPU_GEN_TOP=${GPU_GEN_BATCHES##*,} # its largest, for the sampled rows
GPU_GEN_SHAPE=${GPU_GEN_SHAPE:-"--layers 16 --hidden 2048 --heads 32 --kv-heads 8 --intermediate 8192 --vocab 128256"}

started=$(date +%s)
mkdir -p "$OUT"
rm -f "$OUT"/*.dat "$OUT"/*.log "$OUT"/*.cfg "$OUT"/*.dump
work=$(mktemp -d /tmp/kinfer-bench-XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # The scratch directory (server logs, models) is kept only after a failure.
  if [ "$rc" = 0 ]; then rm -rf "$work"; else echo "bench: logs kept in $work" >&2; fi
}
trap cleanup EXIT
say() { echo "bench: [$(( $(date +%s) - started ))s] $*" >&2; }
die() { echo "bench: FAILED: $*" >&2; exit 1; }

# kv KEY LINE: the value of KEY=... in a `name: k=v ...` line.
kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2" | head -n1; }
# calc EXPR: floating-point arithmetic (awk; P decimals, default 0). A
# missing input ("-" where a number belongs) makes the result "-".
calc() {
  local -a w
  local i
  read -ra w <<<"$*"
  for ((i = 0; i < ${#w[@]}; i++)); do
    [ "${w[i]}" = - ] || continue
    if [ "$i" = 0 ] || [ $((i + 1)) = ${#w[@]} ] || [[ ${w[i - 1]} == [-+*/\(] ]] \
       || [[ ${w[i + 1]} == [-+*/\)] ]]; then
      echo -
      return
    fi
  done
  awk "BEGIN { printf \"%.${P:-0}f\", $* }"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
  || shuf -i 20000-60000 -n 1; }
rcli() { redis-cli -p "$rport" "$@" >/dev/null; }

[ -x "$K" ] || die "$K not built (make bench builds it)"
case "$BENCH_GPU" in
  auto) if $K --version | grep -q 'usable device' && ! $K --version | grep -q ' 0 usable'; then
          GPU=1; else GPU=0; fi ;;
  *) GPU=$BENCH_GPU ;;
esac
$K bench --help >/dev/null 2>&1 || die "$K has no 'bench' command"
command -v gnuplot >/dev/null || die "gnuplot missing (make bench installs it)"

# ---- servers and models --------------------------------------------------------
# start_broker NAME PARTITIONS TOPICS: an embedded broker; its bootstrap
# address into BROKERS.
start_broker() {
  $K broker --partitions "$2" --topics "$3" </dev/null >"$work/$1.out" 2>"$work/$1.log" &
  pids+=("$!")
  for _ in $(seq 200); do [ -s "$work/$1.out" ] && break; sleep 0.05; done
  BROKERS=$(head -n1 "$work/$1.out")
  [ -n "$BROKERS" ] || die "broker $1 did not start: $(tail -n3 "$work/$1.log")"
}
gpu_topics=""
[ "$GPU" = 1 ] && gpu_topics="gpu-tiny,gpu-mlp,gpu-enc,"
start_broker broker "$PARTITIONS" \
  "floor,$(for r in $(seq "$ROUNDS"); do printf 'pass-%s,tiny-%s,mlp-%s,' "$r" "$r" "$r"; done)${gpu_topics}enc-true,enc-false,results,jobs.dlq"
brokers=$BROKERS
# A second broker for the latency runs, with few partitions. The mock finds
# the message set a fetch asks for by walking the partition's list of them
# from the oldest (rd_kafka_mock_msgset_find), and an open-loop producer
# spread over 64 partitions appends sets of about one message each: the
# walk grows with every run until the broker spends its time there (p50 at
# 3000 jobs/s went 30 -> 42 -> 266 ms over three runs on one 64-partition
# topic; steady at ~20 ms on 8). A real Kafka indexes its log.
start_broker lat-broker "$LAT_PARTITIONS" "lat-pass,$(for w in $WAITS; do printf 'lat-w%s,' "$w"; done)results,jobs.dlq"
lat_brokers=$BROKERS
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  >"$work/redis.log" 2>&1 &
pids+=("$!")
for _ in $(seq 200); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$rport" ping >/dev/null 2>&1 || die "redis-server did not start"
say "brokers $brokers ($PARTITIONS partitions per topic) and $lat_brokers ($LAT_PARTITIONS), redis 127.0.0.1:$rport, scratch $work"

$K model demo -o "$work/tiny.safetensors" --in 768 --hidden 16 --out 768 --seed 1 >/dev/null
$K model demo -o "$work/mlp.safetensors" --in 768 --hidden 3072 --out 768 --seed 2 >/dev/null
[ "$BENCH_ENC" = 1 ] && $K model demo --kind bert -o "$work/minilm" --layers 6 --hidden 384 \
  --heads 12 --intermediate 1536 --seed 3 >/dev/null

# write_cfg NAME TOPIC MODEL [BROKERS [PROPERTIES]]: a worker config for
# one measurement (a topic of its own, one model); the rest is worker.cfg's
# defaults. PROPERTIES replaces the librdkafka properties (default: the
# fetch wait the embedded broker needs).
write_cfg() {
  local props=${5:-}
  [ -n "$props" ] || props='( "fetch.wait.max.ms", "10" )'
  cat >"$work/$1.cfg" <<EOF
# written by bench/run.sh
kafka = {
  brokers = "${4:-$brokers}";
  topics = [ "$2" ];
  properties = ( $props );
};
redis = { port = $rport; };
EOF
  if [ -d "$work/$3" ]; then
    # A model folder (the encoder): its files say what it is.
    echo "models = ( { name = \"$3\"; path = \"$3\"; } );" >>"$work/$1.cfg"
  else
    cat >>"$work/$1.cfg" <<EOF
models = (
  { name = "$3"; path = "$3.safetensors";
    layers = ( { op = "dense"; weight = "0.weight"; bias = "0.bias"; },
               { op = "relu"; },
               { op = "dense"; weight = "2.weight"; bias = "2.bias"; } ); }
);
EOF
  fi
  cp "$work/$1.cfg" "$OUT/$1.cfg"
}

# start_worker NAME CFG [--set K=V]...: runs kinfer worker in the
# background (pid in WPID; the collector's run stops if it exits); with
# WAIT_ASSIGN=1 returns once it owns its partitions. Its metrics endpoint
# takes a free port (127.0.0.1:0) unless the caller names one, so a worker
# running elsewhere on the machine (on 9464, worker.cfg's) is no obstacle.
WPID="" WNAME=""
start_worker() {
  local name=$1 cfg=$2
  shift 2
  # shellcheck disable=SC2086 # WORKER_SETS is a list of words
  $K worker -c "$cfg" --set "kafka.group=bench-$name" --set metrics.listen=127.0.0.1:0 \
    $WORKER_SETS "$@" 2>"$work/$name.worker.log" &
  WPID=$!
  WNAME=$name
  pids+=("$WPID")
  if [ "${WAIT_ASSIGN:-0}" = 1 ]; then
    for _ in $(seq 600); do
      grep -q 'event=partitions_assigned' "$work/$name.worker.log" && return 0
      kill -0 "$WPID" 2>/dev/null || break
      sleep 0.05
    done
    die "worker $name did not join: $(tail -n3 "$work/$name.worker.log")"
  fi
}

# stop_worker NAME: peak RSS (VmHWM, MiB) into HWM, then SIGTERM and wait.
stop_worker() {
  HWM=$(awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$WPID/status" 2>/dev/null || echo "-")
  kill -TERM "$WPID"
  wait "$WPID" || die "worker $1 exited $?: $(tail -n3 "$work/$1.worker.log")"
  WPID=""
  cp "$work/$1.worker.log" "$OUT/$1.worker.log"
}

# collect_bg NAME CFG ARGS...: starts a collector, returns once it listens.
collect_bg() {
  local name=$1 cfg=$2
  shift 2
  $K bench collect -c "$cfg" --run "$name" --dump "$OUT/$name.dump" "$@" \
    >"$work/$name.collect" 2>"$work/$name.collect.err" &
  CPID=$!
  pids+=("$CPID")
  for _ in $(seq 400); do
    grep -q '^collect: ready' "$work/$name.collect" && return 0
    kill -0 "$CPID" 2>/dev/null || break
    sleep 0.025
  done
  die "collector $name: $(cat "$work/$name.collect.err")"
}

# collect_wait NAME: waits for the collector; its result line into COLL.
# A worker the run needs (WPID) that exits meanwhile ends the run at once,
# with the worker's last lines, rather than after the collector's timeout.
collect_wait() {
  while kill -0 "$CPID" 2>/dev/null; do
    if [ -n "$WPID" ] && ! kill -0 "$WPID" 2>/dev/null; then
      local wrc=0
      wait "$WPID" || wrc=$?
      kill -TERM "$CPID" 2>/dev/null || true
      die "collector $1: worker $WNAME exited ($wrc) before the run finished: $(tail -n3 "$work/$WNAME.worker.log")"
    fi
    sleep 0.2
  done
  wait "$CPID" || die "collector $1: $(grep -v CONFWARN "$work/$1.collect.err" | tail -n3) $(grep '^collect: run' "$work/$1.collect")"
  COLL=$(grep '^collect: run' "$work/$1.collect")
  echo "$COLL" >>"$OUT/raw.log"
}

# produce NAME CFG ARGS...: the load producer; its line into PROD.
produce() {
  local name=$1 cfg=$2
  shift 2
  PROD=$($K bench produce -c "$cfg" --run "$name" "$@" 2>"$work/$name.produce.err") \
    || die "producer $name: $(grep -v CONFWARN "$work/$name.produce.err" | tail -n3)"
  echo "$PROD" >>"$OUT/raw.log"
}

# Close reasons from the worker's last stats line, if it counts them.
close_reasons() {
  local line
  line=$(grep 'event=stats' "$1" | tail -n1)
  grep -oE '\bclose[ds]?_(size|wait|deadline|drain)=[0-9]+' <<<"$line" | paste -sd' ' - || true
}

: >"$OUT/raw.log"

# ---- 1. floors --------------------------------------------------------------------
write_cfg floor floor tiny
say "floors: librdkafka produce/consume of $N_FLOOR job records"
FK=$($K bench floor-kafka -c "$work/floor.cfg" --jobs "$N_FLOOR" --run floor 2>"$work/floor.err") \
  || die "floor-kafka: $(grep -v CONFWARN "$work/floor.err" | tail -n3)"
echo "$FK" >>"$OUT/raw.log"
say "floors: Redis SET of the same bodies, pipelined x32 and unpipelined"
FR32=$($K bench floor-redis -c "$work/floor.cfg" --jobs "$N_REDIS" --pipeline 32 --run fr32) || die "floor-redis"
rcli flushall
FR1=$($K bench floor-redis -c "$work/floor.cfg" --jobs $((N_REDIS / 3)) --pipeline 1 --run fr1) || die "floor-redis"
rcli flushall
printf '%s\n%s\n' "$FR32" "$FR1" >>"$OUT/raw.log"

# ---- 2. passthrough and kinfer on the tiny model -----------------------------------
# Each saturation rate is measured ROUNDS times, on fresh topics and
# groups, and the best is kept: a floor is what the machine can do, and on
# a shared machine one round can lose a second to someone else's work.
# better A B: of two collect lines, the one with the higher rate.
better() {
  if [ -z "$1" ] || awk -v a="$(kv per_s "$2")" -v b="$(kv per_s "$1")" \
       'BEGIN { exit !(a + 0 > b + 0) }'; then echo "$2"; else echo "$1"; fi
}
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (b + 0 > a + 0) ? b : a }'; }
PASS="" TINY="" MLP="" HWM_TINY=0 HWM_MLP=0
for r in $(seq "$ROUNDS"); do
  write_cfg "pass-$r" "pass-$r" tiny
  say "passthrough, round $r: draining a backlog of $N_TINY jobs"
  produce "pass-$r" "$work/pass-$r.cfg" --rate 0 --jobs "$N_TINY"
  collect_bg "pass-$r" "$work/pass-$r.cfg" --from dbsize --jobs "$N_TINY" --no-fetch --timeout 300
  PT=$($K bench passthrough -c "$work/pass-$r.cfg" --set "kafka.group=bench-pass-$r" \
       --jobs "$N_TINY" 2>"$work/pass-$r.err" | grep -v '^passthrough: ready') \
    || die "passthrough: $(grep -v CONFWARN "$work/pass-$r.err" | tail -n3)"
  echo "$PT" >>"$OUT/raw.log"
  collect_wait "pass-$r"
  say "  passthrough: $(kv per_s "$COLL") jobs/s"
  PASS=$(better "$PASS" "$COLL")
  rcli flushall

  write_cfg "tiny-$r" "tiny-$r" tiny
  say "kinfer, tiny model, round $r: draining a backlog of $N_TINY jobs"
  produce "tiny-$r" "$work/tiny-$r.cfg" --rate 0 --jobs "$N_TINY"
  collect_bg "tiny-$r" "$work/tiny-$r.cfg" --from dbsize --jobs "$N_TINY" --timeout 300
  start_worker "tiny-$r" "$work/tiny-$r.cfg"
  collect_wait "tiny-$r"
  say "  kinfer tiny: $(kv per_s "$COLL") jobs/s, mean batch rows $(kv mean_batch_rows "$COLL")"
  if [ "$(better "$TINY" "$COLL")" = "$COLL" ]; then TINY=$COLL best_tiny=$r; fi
  stop_worker "tiny-$r"
  HWM_TINY=$(max "$HWM_TINY" "$HWM")
  rcli flushall
done
REASONS_TINY=$(close_reasons "$work/tiny-$best_tiny.worker.log")

# ---- 3. kinfer on the MLP, and the MLP alone ------------------------------------------
for r in $(seq "$ROUNDS"); do
  write_cfg "mlp-$r" "mlp-$r" mlp
  say "kinfer, MLP 768->3072->768, round $r: draining a backlog of $N_MLP jobs"
  produce "mlp-$r" "$work/mlp-$r.cfg" --rate 0 --jobs "$N_MLP"
  collect_bg "mlp-$r" "$work/mlp-$r.cfg" --from dbsize --jobs "$N_MLP" --timeout 600
  start_worker "mlp-$r" "$work/mlp-$r.cfg"
  collect_wait "mlp-$r"
  say "  kinfer MLP: $(kv per_s "$COLL") jobs/s, mean batch rows $(kv mean_batch_rows "$COLL")"
  if [ "$(better "$MLP" "$COLL")" = "$COLL" ]; then MLP=$COLL best_mlp=$r; fi
  stop_worker "mlp-$r"
  HWM_MLP=$(max "$HWM_MLP" "$HWM")
  rcli flushall
done
REASONS_MLP=$(close_reasons "$work/mlp-$best_mlp.worker.log")
SAT_MLP=$(kv per_s "$MLP")
B=$(P=0 calc "$(kv mean_batch_rows "$MLP")")
[ "$B" != "-" ] && [ "$B" -ge 1 ] || B=1
sizes=$(printf '%s\n' 1 "$B" 32 | sort -nu | paste -sd, -)
# The machine's compute floor, in the better of two layouts: one pass at a
# time on every core (OpenBLAS's own threads), and one single-threaded pass
# per core at once (as that many executors with worker.blas_threads=1 run).
NCPU=$(nproc)
say "MLP forward pass alone at batch $sizes: one pass on $NCPU OpenBLAS threads, then $NCPU one-thread passes at once"
GEMM_ONE=$($K bench gemm -c "$work/mlp-1.cfg" --batch "$sizes" --seconds 2 --threads 0) || die "gemm"
GEMM_PAR=$($K bench gemm -c "$work/mlp-1.cfg" --batch "$sizes" --seconds 2 --threads 1 \
             --parallel "$NCPU") || die "gemm"
printf '%s\n%s\n' "$GEMM_ONE" "$GEMM_PAR" >>"$OUT/raw.log"
gemm_one() { kv rows_per_s "$(grep " batch=$1 " <<<"$GEMM_ONE")"; }
gemm_par() { kv rows_per_s "$(grep " batch=$1 " <<<"$GEMM_PAR")"; }
gemm_at() { max "$(gemm_one "$1")" "$(gemm_par "$1")"; }
gemm_ms() {
  if awk -v a="$(gemm_par "$1")" -v b="$(gemm_one "$1")" 'BEGIN { exit !(a + 0 > b + 0) }'; then
    kv batch_ms "$(grep " batch=$1 " <<<"$GEMM_PAR")"
  else kv batch_ms "$(grep " batch=$1 " <<<"$GEMM_ONE")"; fi
}

# ---- 4. latency at fractions of saturation --------------------------------------------
rcli config set notify-keyspace-events 'E$'
# The latency floor: the passthrough (no batching, no model) at half the
# MLP's saturation rate, measured the same way.
write_cfg lat-pass lat-pass tiny "$lat_brokers" "$LAT_PROPS"
rate=$(calc "$SAT_MLP * 0.5")
jobs=$(calc "$rate * $LAT_S")
say "latency floor: the passthrough at $rate jobs/s"
$K bench passthrough -c "$work/lat-pass.cfg" --set kafka.group=bench-lat-pass --jobs "$((jobs + 1))" \
  >"$work/lat-pass.out" 2>"$work/lat-pass.err" &
PPID_=$!
pids+=("$PPID_")
for _ in $(seq 600); do
  grep -q '^passthrough: ready' "$work/lat-pass.out" && break
  kill -0 "$PPID_" 2>/dev/null || die "passthrough (latency): $(grep -v CONFWARN "$work/lat-pass.err" | tail -n3)"
  sleep 0.05
done
collect_bg lat-pass "$work/lat-pass.cfg" --from redis --no-fetch --jobs "$jobs" --timeout $((LAT_S * 6 + 30))
produce lat-pass "$work/lat-pass.cfg" --rate "$rate" --jobs "$jobs"
collect_wait lat-pass
LATPASS=$COLL
wait "$PPID_" || die "passthrough (latency): $(grep -v CONFWARN "$work/lat-pass.err" | tail -n3)"
say "  passthrough at 50%: p50 $(kv p50_ms "$LATPASS") ms, p99 $(kv p99_ms "$LATPASS") ms"
rcli flushall
for w in $WAITS; do
  write_cfg "lat-w$w" "lat-w$w" mlp "$lat_brokers" "$LAT_PROPS"
  say "latency, max_wait_ms=$w: offered ${LOADS// /, } x $SAT_MLP jobs/s, ${LAT_S} s each"
  WAIT_ASSIGN=1 start_worker "lat-w$w" "$work/lat-w$w.cfg" --set "batching.max_wait_ms=$w"
  # Warm-up (caches, OpenBLAS threads, the producer's idempotence set-up).
  produce "warm-w$w" "$work/lat-w$w.cfg" --rate "$(calc "$SAT_MLP * 0.25")" \
    --jobs "$(calc "$SAT_MLP * 0.5")"
  sleep 1
  : >"$OUT/lat-w$w.dat"
  for f in $LOADS; do
    name="lat-w$w-$(calc "$f * 100")"
    rate=$(calc "$SAT_MLP * $f")
    jobs=$(calc "$rate * $LAT_S")
    collect_bg "$name" "$work/lat-w$w.cfg" --from redis --jobs "$jobs" --timeout $((LAT_S * 6 + 30))
    produce "$name" "$work/lat-w$w.cfg" --rate "$rate" --jobs "$jobs"
    collect_wait "$name"
    say "  $(calc "$f * 100")%: p50 $(kv p50_ms "$COLL") ms, p99 $(kv p99_ms "$COLL") ms"
    printf '%s %s %s %s %s %s %s %s\n' "$(calc "$f * 100")" "$rate" "$(kv p50_ms "$COLL")" \
      "$(kv p90_ms "$COLL")" "$(kv p99_ms "$COLL")" "$(kv mean_batch_rows "$COLL")" \
      "$(kv batch_infer_ms "$COLL")" "$(kv max_lag_ms "$PROD")" >>"$OUT/lat-w$w.dat"
    rcli flushall
  done
  stop_worker "lat-w$w"
  eval "HWM_LAT_$w=\$HWM"
done
rcli config set notify-keyspace-events ''

# ---- 5. the GPU ------------------------------------------------------------------------------
pct() { P=0 calc "100 * $1 / $2"; }
k() { P=1 calc "$1 / 1000"; }
PASS_R=$(kv per_s "$PASS")
# Dense peak TFLOP/s by precision for the devices kinfer is measured on
# (NVIDIA's H100 SXM datasheet, dense; the H200 has the same compute);
# "-" for another device: the rows still print rows/s and TFLOP/s.
peak_tflops() {
  case "$1:$2" in
    *H100*:fp32|*H200*:fp32) echo 67 ;;
    *H100*:tf32|*H200*:tf32) echo 495 ;;
    *H100*:fp16|*H200*:fp16|*H100*:bf16|*H200*:bf16) echo 989 ;;
    *) echo - ;;
  esac
}
# metric NAME PORT: the sum of a metric's samples on a worker's /metrics.
metric() { curl -s "http://127.0.0.1:$2/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" { s += $2 } END { print s + 0 }'; }
GPU_ROWS=""
if [ "$GPU" = 1 ]; then
  GPU_DEV=$($K --version | sed -n 's/.*usable devices\{0,1\} (\(.*\))$/\1/p')
  say "GPU ($BENCH_GPU_BACKEND): ${GPU_DEV:-unknown device}"
  for p in $GPU_PRECISIONS; do
    say "  MLP forward pass alone, $p, batch $GPU_BATCHES"
    G=$($K bench gemm -c "$work/mlp-1.cfg" --set "worker.backend=$BENCH_GPU_BACKEND" \
          --set "gpu.precision=$p" --batch "$GPU_BATCHES" --seconds 2) || die "gemm on the GPU ($p)"
    echo "$G" >>"$OUT/raw.log"
    peak=$(peak_tflops "$GPU_DEV" "$p")
    for b in ${GPU_BATCHES//,/ }; do
      line=$(grep " batch=$b " <<<"$G")
      tf=$(kv tflops "$line")
      GPU_ROWS+="| GPU forward pass alone, MLP, $p, batch $b | $(k "$(kv rows_per_s "$line")")k rows/s, $tf TFLOP/s | $( [ "$peak" = - ] && echo "device peak unknown" || echo "$(P=1 calc "100 * $tf / $peak")% of $peak dense") |"$'\n'
    done
  done
  for m in tiny mlp; do
    write_cfg "gpu-$m" "gpu-$m" "$m"
    mport=$(free_port)
    say "kinfer on the GPU, $m model: draining a backlog of $N_GPU jobs"
    produce "gpu-$m" "$work/gpu-$m.cfg" --rate 0 --jobs "$N_GPU"
    collect_bg "gpu-$m" "$work/gpu-$m.cfg" --from dbsize --jobs "$N_GPU" --timeout 600
    t0=$(date +%s.%N)
    start_worker "gpu-$m" "$work/gpu-$m.cfg" --set "worker.backend=$BENCH_GPU_BACKEND" \
      --set "metrics.listen=127.0.0.1:$mport"
    collect_wait "gpu-$m"
    busy=$(metric kinfer_gpu_busy_seconds_total "$mport")
    wall=$(calc "$(date +%s.%N) - $t0")
    cpu=$(awk '{ printf "%.1f", ($14 + $15) / 100 }' "/proc/$WPID/stat" 2>/dev/null || echo -)
    stop_worker "gpu-$m"
    rcli flushall
    rate=$(kv per_s "$COLL")
    floor=$PASS_R
    GPU_ROWS+="| **kinfer on the GPU, $m model, saturation** | **$(k "$rate")k jobs/s** | **$(pct "$rate" "$floor")% of passthrough**; device busy $(P=2 calc "$busy / $wall"), worker CPU ${cpu} s in ${wall%.*} s, mean batch rows $(kv mean_batch_rows "$COLL") |"$'\n'
    say "  $(k "$rate")k jobs/s, device busy $(P=2 calc "$busy / $wall")"
  done
  # Encoders on the GPU: BERT-base- and MiniLM-shaped random models, every
  # text 128 tokens (the published anchors' length), per precision and
  # token budget; PyTorch on the same GPU and batches when it has CUDA;
  # then kinfer end to end on text jobs.
  if [ "$BENCH_ENC" = 1 ]; then
    $K model demo --kind bert -o "$work/bertbase" --layers 12 --hidden 768 --heads 12 \
      --intermediate 3072 --seed 4 >/dev/null
    torch_gpu=0
    $GPU_PYTHON -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
      2>/dev/null && torch_gpu=1
    for m in bertbase minilm; do
      write_cfg "genc-$m" enc-true "$m"
      for p in $GPU_PRECISIONS; do
        for tok in $GPU_ENC_TOKENS; do
          say "  encoder $m forward pass alone, $p, $tok tokens per batch"
          E=$($K bench encode -c "$work/genc-$m.cfg" --set "worker.backend=$BENCH_GPU_BACKEND" \
                --set "gpu.precision=$p" --set "batching.max_batch_tokens=$tok" \
                --set "batching.max_batch_rows=$((tok / 128))" --jobs "$GPU_ENC_SEQS" \
                --length 128 --seconds "$ENC_SECONDS" --dump "$work/genc-$m-$tok.jsonl") \
            || die "bench encode on the GPU ($m, $p)"
          echo "$E" >>"$OUT/raw.log"
          peak=$(peak_tflops "$GPU_DEV" "$p")
          tf=$(P=1 calc "$(kv gflops "$E") / 1000")
          GPU_ROWS+="| GPU encoder $m, 128 tokens, $p, $tok tokens/batch | $(kv seqs_per_s "$E") seq/s, $(k "$(kv tokens_per_s "$E")")k tokens/s, $tf TFLOP/s | $( [ "$peak" = - ] && echo "device peak unknown" || echo "$(P=1 calc "100 * $tf / $peak")% of $peak dense") |"$'\n'
        done
      done
      if [ "$torch_gpu" = 1 ]; then
        tok=${GPU_ENC_TOKENS##* }
        for dt in float32 float16 bfloat16; do
          T=$($GPU_PYTHON bench/torch_encoder_bench.py "$work/$m" "$work/genc-$m-$tok.jsonl" 1 \
                "$ENC_SECONDS" cuda "$dt" 2>"$work/torch-gpu.err") \
            || die "torch on the GPU: $(tail -n3 "$work/torch-gpu.err")"
          echo "$T" >>"$OUT/raw.log"
          GPU_ROWS+="| PyTorch $(kv version "$T") on the GPU, $m, $dt, same batches ($tok tokens) | $(kv seqs_per_s "$T") seq/s, $(k "$(kv tokens_per_s "$T")")k tokens/s | nn.TransformerEncoderLayer, inference mode |"$'\n'
        done
      fi
    done
    write_cfg gpu-enc gpu-enc minilm
    mport=$(free_port)
    say "kinfer on the GPU, encoder minilm, bf16: draining a backlog of $N_ENC text jobs"
    produce gpu-enc "$work/gpu-enc.cfg" --rate 0 --jobs "$N_ENC"
    collect_bg gpu-enc "$work/gpu-enc.cfg" --from dbsize --jobs "$N_ENC" --timeout 600
    t0=$(date +%s.%N)
    start_worker gpu-enc "$work/gpu-enc.cfg" --set "worker.backend=$BENCH_GPU_BACKEND" \
      --set gpu.precision=bf16 --set "metrics.listen=127.0.0.1:$mport"
    collect_wait gpu-enc
    busy=$(metric kinfer_gpu_busy_seconds_total "$mport")
    toks=$(metric kinfer_tokens_total "$mport")
    wall=$(calc "$(date +%s.%N) - $t0")
    stop_worker gpu-enc
    rcli flushall
    rate=$(kv per_s "$COLL")
    GPU_ROWS+="| **kinfer on the GPU, encoder minilm (mixed lengths), bf16, saturation** | **$rate seq/s, $(k "$(calc "$rate * $toks / $N_ENC")")k tokens/s** | device busy $(P=2 calc "$busy / $wall"), mean batch rows $(kv mean_batch_rows "$COLL") |"$'\n'
  fi
fi

# ---- 6. a text encoder ------------------------------------------------------------------------
ENC_ROWS=""
# The CPU backend's own account of a pass: the share of its time in
# cblas_sgemm and its GFLOP/s against the machine's measured cblas_sgemm
# (1024^3, same threads), from `kinfer bench encode`.
gemm_note() {
  [ -n "$(kv gemm_share "$1")" ] || { echo "GEMM share not measured (not the CPU backend)"; return; }
  echo "GEMM $(P=0 calc "100 * $(kv gemm_share "$1")")% of the time, $(P=0 calc "100 * $(kv peak_frac "$1")")% of cblas_sgemm's measured $(kv sgemm_peak_gflops "$1") GFLOP/s"
}
if [ "$BENCH_ENC" = 1 ]; then
  write_cfg enc-alone enc-true minilm
  ENC_ALONE=""
  for t in 1 "$NCPU"; do
    say "encoder forward pass alone, $t thread(s): $ENC_SEQS texts of mixed length, then PyTorch on the same batches"
    E=$($K bench encode -c "$work/enc-alone.cfg" --jobs "$ENC_SEQS" --threads "$t" \
          --seconds "$ENC_SECONDS" --dump "$work/enc-batches.jsonl") || die "bench encode"
    echo "$E" >>"$OUT/raw.log"
    T=$(/usr/bin/python3 bench/torch_encoder_bench.py "$work/minilm" "$work/enc-batches.jsonl" \
          "$t" "$ENC_SECONDS" 2>"$work/torch.err") || die "torch: $(tail -n3 "$work/torch.err")"
    echo "$T" >>"$OUT/raw.log"
    say "  kinfer $(kv seqs_per_s "$E") seq/s, PyTorch $(kv seqs_per_s "$T") seq/s"
    ENC_ROWS+="| encoder 6 x 384 (MiniLM-L6 shape), forward pass alone, $t thread(s) | $(kv seqs_per_s "$E") seq/s, $(k "$(kv tokens_per_s "$E")")k tokens/s, $(kv gflops "$E") GFLOP/s | PyTorch $(kv version "$T"), same batches and threads: $(kv seqs_per_s "$T") seq/s: **kinfer at $(pct "$(kv seqs_per_s "$E")" "$(kv seqs_per_s "$T")")%**; $(gemm_note "$E"); $(kv batches "$E") batches of $(kv mean_batch_rows "$E") rows, $(kv mean_tokens "$E") tokens per text |"$'\n'
    ENC_ALONE=$(max "${ENC_ALONE:-0}" "$(kv seqs_per_s "$E")")
  done
  # worker.cpu_precision = "bf16" (bfloat16 GEMMs, on AMX tiles where the
  # CPU has them) on the MiniLM shape, and the BERT-base shape in both
  # precisions; PyTorch on the same batches in float32 and in bfloat16.
  $K model demo --kind bert -o "$work/bertbase-cpu" --layers 12 --hidden 768 --heads 12 \
    --intermediate 3072 --seed 4 >/dev/null || die "model demo bertbase"
  write_cfg enc-bert enc-true bertbase-cpu
  for spec in "minilm enc-alone bf16 $ENC_SEQS" "bertbase-cpu enc-bert fp32 $ENC_BERT_SEQS" \
              "bertbase-cpu enc-bert bf16 $ENC_BERT_SEQS"; do
    read -r em ecfg ep en <<<"$spec"
    for t in 1 "$NCPU"; do
      say "encoder $em, $ep, $t thread(s): forward pass alone, then PyTorch float32 and bfloat16"
      E=$($K bench encode -c "$work/$ecfg.cfg" --jobs "$en" --threads "$t" --seconds "$ENC_SECONDS" \
            --set "worker.cpu_precision=$ep" --dump "$work/enc-$em.jsonl") || die "bench encode"
      echo "$E" >>"$OUT/raw.log"
      T32=$(/usr/bin/python3 bench/torch_encoder_bench.py "$work/$em" "$work/enc-$em.jsonl" "$t" \
              "$ENC_SECONDS" cpu float32 2>"$work/torch.err") || die "torch: $(tail -n3 "$work/torch.err")"
      T16=$(/usr/bin/python3 bench/torch_encoder_bench.py "$work/$em" "$work/enc-$em.jsonl" "$t" \
              "$ENC_SECONDS" cpu bfloat16 2>"$work/torch.err") || die "torch: $(tail -n3 "$work/torch.err")"
      echo "$T32"$'\n'"$T16" >>"$OUT/raw.log"
      best=$(max "$(kv seqs_per_s "$T32")" "$(kv seqs_per_s "$T16")")
      amx=""
      [ -n "$(kv amx_peak_frac "$E")" ] && amx=", $(P=0 calc "100 * $(kv amx_peak_frac "$E")")% of the AMX tiles' measured $(kv amx_peak_gflops "$E") GFLOP/s"
      say "  kinfer $(kv seqs_per_s "$E") seq/s, PyTorch float32 $(kv seqs_per_s "$T32"), bfloat16 $(kv seqs_per_s "$T16")"
      ENC_ROWS+="| **encoder $(sed 's/-cpu//; s/minilm/6 x 384 (MiniLM-L6 shape)/; s/bertbase/12 x 768 (BERT-base shape)/' <<<"$em"), cpu_precision $ep, forward pass alone, $t thread(s)** | **$(kv seqs_per_s "$E") seq/s**, $(kv gflops "$E") GFLOP/s | PyTorch $(kv version "$T32") on the same batches and threads: float32 $(kv seqs_per_s "$T32"), bfloat16 $(kv seqs_per_s "$T16") seq/s: **kinfer at $(P=2 calc "$(kv seqs_per_s "$E") / $best")x the better**; $(gemm_note "$E")$amx |"$'\n'
    done
  done
  # The worker's own layout: one single-threaded pass per core at once.
  E=$($K bench encode -c "$work/enc-alone.cfg" --jobs "$ENC_SEQS" --threads 1 \
        --parallel "$NCPU" --seconds "$ENC_SECONDS") || die "bench encode"
  echo "$E" >>"$OUT/raw.log"
  ENC_ROWS+="| encoder forward pass alone, $NCPU one-thread passes at once | $(kv seqs_per_s "$E") seq/s, $(k "$(kv tokens_per_s "$E")")k tokens/s, $(kv gflops "$E") GFLOP/s | as $NCPU executors run it (batching.executors 0, worker.blas_threads 1); $(gemm_note "$E") |"$'\n'
  ENC_ALONE=$(max "$ENC_ALONE" "$(kv seqs_per_s "$E")")
  for g in true false; do
    write_cfg "enc-$g" "enc-$g" minilm
    mport=$(free_port)
    say "kinfer, encoder, group_by_length=$g: draining a backlog of $N_ENC text jobs"
    produce "enc-$g" "$work/enc-$g.cfg" --rate 0 --jobs "$N_ENC"
    collect_bg "enc-$g" "$work/enc-$g.cfg" --from dbsize --jobs "$N_ENC" --timeout 1200
    start_worker "enc-$g" "$work/enc-$g.cfg" --set "batching.group_by_length=$g" \
      --set "metrics.listen=127.0.0.1:$mport"
    collect_wait "enc-$g"
    toks=$(metric kinfer_tokens_total "$mport")
    padded=$(metric kinfer_padded_tokens_total "$mport")
    stop_worker "enc-$g"
    rcli flushall
    rate=$(kv per_s "$COLL")
    tps=$(calc "$rate * $toks / $N_ENC")
    padr=$(P=3 calc "1 - $toks / $padded")
    say "  $rate seq/s, $tps tokens/s, padding ratio $padr"
    eval "ENC_RATE_$g=\$rate ENC_TPS_$g=\$tps ENC_PAD_$g=\$padr"
    eval "ENC_MBR_$g=\$(kv mean_batch_rows \"\$COLL\") ENC_HWM_$g=\$HWM"
  done
  ENC_ROWS+="| **kinfer, encoder end to end, saturation** | **$ENC_RATE_true seq/s, $(k "$ENC_TPS_true")k tokens/s** | **$(pct "$ENC_RATE_true" "$ENC_ALONE")% of its forward pass alone** (the better layout above); mean batch rows $ENC_MBR_true; peak RSS $ENC_HWM_true MiB |"$'\n'
  ENC_ROWS+="| padding ratio of the batches kinfer formed (padded tokens that were padding) | group_by_length on: $ENC_PAD_true | off: $ENC_PAD_false (then $ENC_RATE_false seq/s); the CPU backend packs sequences, so padding costs it nothing: this is what a padding backend would pay |"$'\n'
fi

# ---- 7. text generation on the CPU --------------------------------------------------------
GEN_ROWS=""
if [ "$BENCH_GEN" = 1 ]; then
  # The f32 and bf16 folders in fp32, then the bf16 folder in
  # worker.cpu_precision "bf16" (against the same PyTorch run).
  for spec in "f32 fp32" "bf16 fp32" "bf16 bf16"; do
    read -r dt prec <<<"$spec"
    [ -d "$work/smol-$dt" ] || $K model demo --kind llama -o "$work/smol-$dt" --layers 30 \
      --hidden 576 --heads 9 --kv-heads 3 --intermediate 1536 --vocab 49152 --dtype "$dt" \
      >/dev/null || die "model demo llama $dt"
    say "generation, SmolLM2-135M shape, $dt folder, cpu_precision $prec: kinfer then PyTorch, $NCPU threads"
    G=$($K bench generate -c worker.cfg --model "$work/smol-$dt" --threads "$NCPU" \
          --batch "$GEN_BATCHES" --length "$GEN_PROMPT" --steps "$GEN_STEPS" \
          --set worker.backend=cpu --set "worker.cpu_precision=$prec") || die "bench generate"
    echo "$G" >>"$OUT/raw.log"
    if [ "$prec" = fp32 ]; then
      T=$(/usr/bin/python3 bench/torch_decoder_bench.py "$work/smol-$dt" "$NCPU" "$GEN_PROMPT" \
            "$GEN_STEPS" "$GEN_BATCHES" 2>"$work/torch.err") || die "torch: $(tail -n3 "$work/torch.err")"
      echo "$T" >>"$OUT/raw.log"
    fi
    [ "$prec" = fp32 ] && dt_label="$dt folder" || dt_label="$dt folder, cpu_precision bf16"
    bw=$(kv read_gbs "$(grep phase=bandwidth <<<"$G")")
    wmb=$(P=0 calc "$(kv weight_bytes "$(grep phase=bandwidth <<<"$G")") / 1e6")
    gp=$(kv tokens_per_s "$(grep phase=prefill <<<"$G")")
    tp=$(kv tokens_per_s "$(grep phase=prefill <<<"$T")")
    GEN_ROWS+="| generation, SmolLM2-135M shape, $dt_label, prefill of $GEN_PROMPT tokens, $NCPU threads | $gp tokens/s | PyTorch $tp tokens/s: kinfer at $(pct "$gp" "$tp")% |"$'\n'
    for b in ${GEN_BATCHES//,/ }; do
      gl=$(grep "phase=decode .*seqs=$b " <<<"$G")
      tl=$(grep "phase=decode .*seqs=$b " <<<"$T")
      gd=$(kv tokens_per_s "$gl")
      td=$(kv tokens_per_s "$tl")
      say "  $dt_label, $b sequence(s): kinfer $gd tokens/s, PyTorch $td, bound $(kv bound_tokens_per_s "$gl")"
      GEN_ROWS+="| **generation, $dt_label, decode, $b sequence(s) at once** | **$gd tokens/s** | **$(P=0 calc "100 * $(kv bound_frac "$gl")")% of the bandwidth bound** ($(kv bound_tokens_per_s "$gl") tokens/s: $bw GB/s read over $wmb MB of weights per step; GEMMs $(P=0 calc "100 * $(kv gemm_share "$gl")")% of a step, reading $(kv gemm_read_gbs "$gl") GB/s of weights); PyTorch $td tokens/s: kinfer at $(pct "$gd" "$td")% |"$'\n'
    done
  done
fi

# ---- 8. text generation on the GPU ----------------------------------------------------------
# A Llama-shaped model of about 1B parameters (Llama 3.2 1B's shapes, random
# weights) in bf16 on the device, against the device's peak memory
# bandwidth (the bound: weight bytes per step) and transformers' generate()
# on the same GPU when $GPU_PYTHON has it.
if [ "$GPU" = 1 ] && [ "$BENCH_GEN" = 1 ]; then
  # shellcheck disable=SC2086 # GPU_GEN_SHAPE is a list of options
  [ -d "$work/llama1b" ] || $K model demo --kind llama -o "$work/llama1b" $GPU_GEN_SHAPE \
    --dtype bf16 >/dev/null || die "model demo llama 1B"
  say "generation on the GPU, Llama-1B shape, bf16: kinfer, then transformers"
  G=$($K bench generate -c worker.cfg --model "$work/llama1b" --batch "$GPU_GEN_BATCHES" \
        --length "$GEN_PROMPT" --steps "$GEN_STEPS" --set "worker.backend=$BENCH_GPU_BACKEND" \
        --set gpu.precision=bf16) || die "bench generate on the GPU"
  echo "$G" >>"$OUT/raw.log"
  # one sequence again with each step waiting for the one before, for what chaining saves
  G1=$($K bench generate -c worker.cfg --model "$work/llama1b" --batch 1 \
        --length "$GEN_PROMPT" --steps "$GEN_STEPS" --set "worker.backend=$BENCH_GPU_BACKEND" \
        --set gpu.precision=bf16 --set generation.overlap=false) || die "bench generate, no overlap"
  echo "$G1" >>"$OUT/raw.log"
  # sampled as chat clients ask (temperature 0.7, top-k 50, top-p 0.95), and
  # top-p alone over the random model's flat logits (its nucleus is most of
  # the vocabulary: the sampler's whole-row path), for what sampling costs
  GS=$($K bench generate -c worker.cfg --model "$work/llama1b" --batch "1,$GPU_GEN_TOP" \
        --length "$GEN_PROMPT" --steps "$GEN_STEPS" --set "worker.backend=$BENCH_GPU_BACKEND" \
        --set gpu.precision=bf16 --sampling 0.7,50,0.95) || die "bench generate, sampled"
  GP=$($K bench generate -c worker.cfg --model "$work/llama1b" --batch 1 \
        --length "$GEN_PROMPT" --steps "$GEN_STEPS" --set "worker.backend=$BENCH_GPU_BACKEND" \
        --set gpu.precision=bf16 --sampling 1,0,0.95) || die "bench generate, top-p alone"
  echo "$GS" >>"$OUT/raw.log"
  echo "$GP" >>"$OUT/raw.log"
  T=""
  if $GPU_PYTHON -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
    T=$($GPU_PYTHON bench/hf_generate_bench.py "$work/llama1b" "$GEN_PROMPT" "$GEN_STEPS" \
          "$GPU_GEN_BATCHES" 2>"$work/hf.err") || die "transformers: $(tail -n3 "$work/hf.err")"
    echo "$T" >>"$OUT/raw.log"
  fi
  bl=$(grep phase=bandwidth <<<"$G")
  gp=$(kv tokens_per_s "$(grep phase=prefill <<<"$G")")
  tp=$([ -n "$T" ] && kv tokens_per_s "$(grep phase=prefill <<<"$T")" || echo -)
  GEN_ROWS+="| generation on the GPU, Llama-1B shape, bf16, prefill of $GEN_PROMPT tokens | $gp tokens/s | transformers $tp tokens/s |"$'\n'
  for b in ${GPU_GEN_BATCHES//,/ }; do
    gl=$(grep "phase=decode .*seqs=$b " <<<"$G")
    gd=$(kv tokens_per_s "$gl")
    td=$([ -n "$T" ] && kv tokens_per_s "$(grep "phase=decode seqs=$b " <<<"$T")" || echo -)
    say "  GPU, $b sequence(s): kinfer $gd tokens/s, transformers $td, bound $(kv bound_tokens_per_s "$gl")"
    GEN_ROWS+="| **generation on the GPU, Llama-1B shape, bf16, decode, $b sequence(s) at once** | **$gd tokens/s** | **$(P=0 calc "100 * $(kv bound_frac "$gl")")% of the bandwidth bound** ($(kv bound_tokens_per_s "$gl") tokens/s: the device's $(kv read_gbs "$bl") GB/s peak over $(P=0 calc "$(kv weight_bytes "$bl") / 1e6") MB of weights per step); transformers generate() $td tokens/s$([ "$td" != - ] && echo ": kinfer at $(pct "$gd" "$td")%") |"$'\n'
  done
  g1=$(grep "phase=decode .*seqs=1 " <<<"$G1")
  GEN_ROWS+="| generation on the GPU, decode, 1 sequence, generation.overlap = false | $(kv tokens_per_s "$g1") tokens/s | $(P=0 calc "100 * $(kv bound_frac "$g1")")% of the bandwidth bound (each step waits for the one before) |"$'\n'
  for b in 1 "$GPU_GEN_TOP"; do
    gs=$(grep "phase=decode .*seqs=$b " <<<"$GS")
    gg=$(kv tokens_per_s "$(grep "phase=decode .*seqs=$b " <<<"$G")")
    GEN_ROWS+="| generation on the GPU, decode, $b sequence(s), sampled (temperature 0.7, top-k 50, top-p 0.95) | $(kv tokens_per_s "$gs") tokens/s | greedy $gg tokens/s: sampled at $(pct "$(kv tokens_per_s "$gs")" "$gg")% |"$'\n'
  done
  gp1=$(grep "phase=decode .*seqs=1 " <<<"$GP")
  GEN_ROWS+="| generation on the GPU, decode, 1 sequence, top-p 0.95 alone over flat logits (the sampler's whole-row path) | $(kv tokens_per_s "$gp1") tokens/s | greedy $(kv tokens_per_s "$(grep "phase=decode .*seqs=1 " <<<"$G")") tokens/s |"$'\n'
fi

# ---- the table ----------------------------------------------------------------------------
FKP=$(kv produce_per_s "$FK"); FKC=$(kv consume_per_s "$FK")
TINY_R=$(kv per_s "$TINY")
GB=$(gemm_at "$B")
hwm_lat=$(for w in $WAITS; do eval "printf '%s ' \"\$HWM_LAT_$w\""; done)
{
  echo "| measurement | result | ratio / note |"
  echo "|---|---|---|"
  echo "| Kafka produce, librdkafka, worker's producer settings | $(k "$FKP")k msg/s | $N_FLOOR records of $(kv mean_bytes "$FK") B, $PARTITIONS partitions, embedded broker |"
  echo "| Kafka consume, high-level consumer | $(k "$FKC")k msg/s | same records |"
  echo "| Redis SET, pipelined x32, one connection | $(k "$(kv sets_per_s "$FR32")")k/s | distinct keys, PX ttl, as the sink writes |"
  echo "| Redis SET, unpipelined | $(k "$(kv sets_per_s "$FR1")")k/s | |"
  echo "| passthrough: consume -> produce + pipelined SET | $(k "$PASS_R")k jobs/s | the floor for the tiny model; best of $ROUNDS |"
  echo "| MLP forward pass alone, batch $B ($(gemm_ms "$B") ms/batch) | $(k "$GB")k rows/s | the floor for the MLP, the better of one pass on $NCPU threads ($(k "$(gemm_one "$B")")k) and $NCPU one-thread passes at once ($(k "$(gemm_par "$B")")k); batch 1: $(k "$(gemm_at 1)")k, batch 32: $(k "$(gemm_at 32)")k |"
  echo "| latency floor: passthrough at 50% of the MLP's saturation | p50 $(kv p50_ms "$LATPASS") ms, p99 $(kv p99_ms "$LATPASS") ms | producer linger + broker + Redis, no batching or model |"
  echo "| **kinfer, tiny model 768->16->768, saturation** | **$(k "$TINY_R")k jobs/s** | **$(pct "$TINY_R" "$PASS_R")% of passthrough** (target >= 70%); best of $ROUNDS |"
  echo "| **kinfer, MLP 768->3072->768, saturation** | **$(k "$SAT_MLP")k jobs/s** | **$(pct "$SAT_MLP" "$GB")% of its forward pass at batch $B** (target >= 85%); best of $ROUNDS |"
  echo "| mean batch rows at saturation (max_batch_rows 32) | tiny $(kv mean_batch_rows "$TINY"), MLP $(kv mean_batch_rows "$MLP") | full batches: tiny $(kv full_batch_pct "$TINY")%, MLP $(kv full_batch_pct "$MLP")% |"
  echo "| batches closed by size / by time, from batch_rows (one-row jobs) | tiny $(kv full_batch_pct "$TINY")% / $(P=1 calc "100 - $(kv full_batch_pct "$TINY")")%, MLP $(kv full_batch_pct "$MLP")% / $(P=1 calc "100 - $(kv full_batch_pct "$MLP")")% | |"
  echo "| close reasons, the worker's counters at exit | tiny: ${REASONS_TINY:-n/a (pending)} | MLP: ${REASONS_MLP:-n/a (pending)} |"
  echo "| worker peak RSS (VmHWM) | tiny $HWM_TINY MiB, MLP $HWM_MLP MiB | latency runs: ${hwm_lat% } MiB |"
  printf '%s' "$GPU_ROWS"
  printf '%s' "$ENC_ROWS"
  printf '%s' "$GEN_ROWS"
  echo
  echo "Latency from record timestamp to result in Redis (MLP; load = offered jobs/s as a fraction of the MLP's saturation rate above):"
  echo
  echo "| max_wait_ms | load | offered jobs/s | p50 ms | p99 ms | mean batch rows | batch compute ms | p99 target ms |"
  echo "|---|---|---|---|---|---|---|---|"
  for w in $WAITS; do
    while read -r l rate p50 _ p99 mbr inf _; do
      [ "$l" = 25 ] || [ "$l" = 50 ] || [ "$l" = 75 ] || continue
      target=$(P=1 calc "$w + 3 * $inf + 10")
      mark=""
      [ "$l" = 50 ] && mark=$(awk -v a="$p99" -v b="$target" 'BEGIN { print (a <= b) ? " (met)" : " (missed)" }')
      echo "| $w | $l% | $rate | $p50 | $p99 | $mbr | $inf | ${target}${mark} |"
    done <"$OUT/lat-w$w.dat"
  done
} >"$OUT/table.md"

gnuplot -e "dir='$OUT'; waits='$WAITS'; out='$OUT/bench-latency.png'; sat='$SAT_MLP'" bench/plot.gp \
  || die "gnuplot"

machine="$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -n1), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM, $(uname -sr)"
libs="librdkafka $(dpkg-query -W -f='${Version}' librdkafka1 2>/dev/null || echo '?'), hiredis $(dpkg-query -W -f='${Version}' libhiredis0.14 2>/dev/null || echo '?'), OpenBLAS $(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo '?'), redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')"
# (|| true: on a clean tree grep finds nothing, which must not end the run)
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with uncommitted changes)' || true)"
{
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, $(( $(date +%s) - started )) s${WORKER_SETS:+; workers with $WORKER_SETS}."
  echo "Machine: $machine; $libs."
  echo
  cat "$OUT/table.md"
  echo
  echo '![latency vs offered load](bench-latency.png)'
  echo
  echo "Raw lines (\`kinfer bench\` output):"
  echo
  echo '```'
  cat "$OUT/raw.log"
  echo '```'
} >"$OUT/results.md"

echo
cat "$OUT/table.md"
echo
echo "bench: $(( $(date +%s) - started )) s; details in $OUT/results.md, plot $OUT/bench-latency.png"
if [ "$UPDATE_DOCS" = 1 ] && grep -q '<!-- bench:begin -->' docs/benchmarks.md 2>/dev/null; then
  cp "$OUT/bench-latency.png" docs/bench-latency.png
  awk -v res="$OUT/results.md" '
    /<!-- bench:begin -->/ { print; while ((getline l < res) > 0) print l; skip = 1; next }
    /<!-- bench:end -->/ { skip = 0 }
    !skip' docs/benchmarks.md >"$work/benchmarks.md"
  cp "$work/benchmarks.md" docs/benchmarks.md
  echo "bench: docs/benchmarks.md and docs/bench-latency.png updated"
fi
