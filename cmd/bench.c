/* bench.c (cmd/) - `kinfer bench`: finds the subcommand (produce, collect,
 * the floors, gemm, encode, generate), parses its options, loads the configuration
 * once and runs the measurement (tools/bench.c) on this thread.
 *
 * Threads: the main thread. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/bench.h"
#include "cli.h"
#include "commands.h"

struct bench_cmd {
    const char *name;
    const char *takes;   /* short options the command accepts */
    int (*run)(const struct kcfg *c, const struct bench_opts *o);
    const char *usage;
};

static const struct bench_cmd bench_cmds[] = {
    {"produce", "nrwRu", bench_produce,
     "usage: kinfer bench produce -c FILE [--set K=V]... --rate R --jobs N [--rows K]\n"
     "                            [--width W] [--run NAME]\n"
     "Open-loop load: N jobs (MessagePack, K rows of W floats; W defaults to the\n"
     "default model's input width; for an encoder, one text each, of the mix\n"
     "`bench encode` describes) to the first input topic, job i due at\n"
     "start + i/R; record timestamp = due time, id = NAME.i.<due, us since epoch>.\n"
     "--rate 0 sends as fast as possible (to preload a backlog).\n"},
    {"collect", "nufTND", bench_collect,
     "usage: kinfer bench collect -c FILE [--set K=V]... --jobs N --run NAME\n"
     "                            [--from redis|topic|dbsize] [--timeout S] [--no-fetch]\n"
     "                            [--dump FILE]\n"
     "Waits for the results of run NAME, then prints throughput, latency from\n"
     "record timestamp to result (p50/p90/p99/max) and batching. Prints\n"
     "'collect: ready' once listening.\n"
     "  redis   (default) Redis keyspace events: needs notify-keyspace-events E$\n"
     "  topic   the reply topic, read from its current end\n"
     "  dbsize  counts keys only (throughput, no latency): cheapest\n"
     "Afterwards (redis, dbsize) the bodies are read from Redis unless --no-fetch.\n"
     "--dump writes 'seq send_us arrival_us latency_ms' per result to FILE.\n"},
    {"floor-kafka", "nrwuT", bench_floor_kafka,
     "usage: kinfer bench floor-kafka -c FILE [--set K=V]... --jobs N [--rows K] [--width W]\n"
     "Produces N job records to the first input topic, then consumes them, with\n"
     "the worker's client settings; prints both rates.\n"},
    {"floor-redis", "nrwuP", bench_floor_redis,
     "usage: kinfer bench floor-redis -c FILE [--set K=V]... --jobs N [--pipeline P]\n"
     "                                [--rows K] [--width W]\n"
     "N pipelined SETs of job bodies (P per round trip, default max_batch_rows).\n"},
    {"passthrough", "nPT", bench_passthrough,
     "usage: kinfer bench passthrough -c FILE [--set K=V]... --jobs N [--pipeline P]\n"
     "                                [--timeout S]\n"
     "Consumes the input topics and writes each record's value unchanged to the\n"
     "reply topic and to Redis (P SETs per round trip), one thread; exits after N.\n"
     "Prints 'passthrough: ready' once it has partitions.\n"},
    {"gemm", "btSe", bench_gemm,
     "usage: kinfer bench gemm -c FILE [--set K=V]... [--batch 1,32,128] [--threads T]\n"
     "                         [--parallel E] [--seconds S]\n"
     "The default model's forward pass alone on the configured backend\n"
     "(worker.backend, gpu.*: --set gpu.precision=bf16): rows/s at each batch size,\n"
     "with T OpenBLAS threads (0 = its default) and E passes at once, one per\n"
     "thread (as E executors run them, each on its own slot and, on a GPU, its own\n"
     "stream; default 1); batch_ms is the mean time of one pass, tflops the\n"
     "dense layers' arithmetic rate (2 x in x out per row and layer).\n"},
    {"encode", "ntSDeL", bench_encode,
     "usage: kinfer bench encode -c FILE [--set K=V]... [--jobs N] [--threads T]\n"
     "                           [--parallel E] [--seconds S] [--dump FILE] [--length L]\n"
     "The default model (an encoder) alone on the configured backend: N texts of\n"
     "`bench produce`'s length mix, tokenized, cut into batches as the batcher does\n"
     "at saturation with group_by_length (by length, max_batch_rows rows,\n"
     "max_batch_tokens padded tokens), run back to back for S seconds (whole\n"
     "passes over the batches) by E threads at once (as E executors; default 1),\n"
     "each pass with T OpenBLAS threads. Prints sequences/s,\n"
     "tokens/s, the padding of those batches, and GFLOP/s (projections,\n"
     "feed-forward and attention). --dump writes the batches' ids, a JSON array of\n"
     "arrays per line, for bench/torch_encoder_bench.py. --length L makes every\n"
     "text L tokens instead (at most the model's limit).\n"},
    {"generate", "btLMKm", bench_generate,
     "usage: kinfer bench generate -c FILE [--set K=V]... --model DIR [--batch 1,32,128]\n"
     "                             [--threads T] [--length P] [--steps S]\n"
     "                             [--sampling TEMP,TOP_K,TOP_P]\n"
     "The decoder folder DIR alone on worker.backend (on the CPU with T threads):\n"
     "the memory bandwidth (the CPU's read bandwidth on T threads over a 1 GiB\n"
     "buffer; a GPU's peak as the device reports it) and the decode bound it sets\n"
     "(bandwidth / bytes of the weights as they are held, read once per step);\n"
     "prefill tokens/s of one P-token prompt (default 128), then per batch size B:\n"
     "B sequences each prefilled with P tokens, then S decode steps (default 64)\n"
     "of one token per sequence (on CUDA picked on the device: greedily, or with\n"
     "--sampling's temperature, top-k (0: off) and top-p (1: off), each sequence\n"
     "its own draws); tokens/s (all sequences together, the median of 3 runs) and\n"
     "the fraction of the bound reached.\n"},
};

static const char bench_usage[] =
    "usage: kinfer bench COMMAND -c FILE [--set K=V]... [options]\n"
    "\n"
    "Load tools and floors for `make bench` (bench/run.sh). Every command reads\n"
    "the worker's configuration, so it sees the worker's brokers, topics, Redis\n"
    "and model, and prints one 'COMMAND: key=value ...' line.\n"
    "\n"
    "  produce       open-loop job producer at a fixed rate\n"
    "  collect       waits for a run's results; latency, throughput, batching\n"
    "  floor-kafka   raw librdkafka produce and consume of the same records\n"
    "  floor-redis   pipelined Redis SET of the same bodies\n"
    "  passthrough   consume -> produce + SET, nothing else\n"
    "  gemm          the model's forward pass alone\n"
    "  encode        an encoder's forward pass alone, on mixed-length texts\n"
    "  generate      a decoder's prefill and decode alone, against the bandwidth\n"
    "\n"
    "  kinfer bench COMMAND --help   options of a command\n";

/* Parses a number option within lo..hi; prints why on failure. */
static int opt_num(const char *name, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kinfer bench: --%s: '%s' is not a number in %g..%g\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Parses the command line of cmd into o (-c and --set for every command,
 * the rest only where cmd->takes lists them). Returns 0, 1 for --help
 * (usage printed), or -1 on a bad option (reason printed). */
static int parse_opts(const struct bench_cmd *cmd, int argc, char **argv,
                      struct cli_config *cc, struct bench_opts *o)
{
    static const struct option longs[] = {
        {"config", required_argument, 0, 'c'}, {"set", required_argument, 0, 's'},
        {"rate", required_argument, 0, 'R'},   {"jobs", required_argument, 0, 'n'},
        {"rows", required_argument, 0, 'r'},   {"width", required_argument, 0, 'w'},
        {"run", required_argument, 0, 'u'},    {"from", required_argument, 0, 'f'},
        {"timeout", required_argument, 0, 'T'}, {"no-fetch", no_argument, 0, 'N'},
        {"batch", required_argument, 0, 'b'},  {"threads", required_argument, 0, 't'},
        {"seconds", required_argument, 0, 'S'}, {"pipeline", required_argument, 0, 'P'},
        {"dump", required_argument, 0, 'D'},   {"help", no_argument, 0, 'h'},
        {"length", required_argument, 0, 'L'},
        {"parallel", required_argument, 0, 'e'},
        {"model", required_argument, 0, 'M'},  {"steps", required_argument, 0, 'K'},
        {"sampling", required_argument, 0, 'm'},
        {0, 0, 0, 0}};
    int ch;
    double v = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:R:n:r:w:u:f:T:Nb:t:S:P:D:he:L:M:K:m:", longs, NULL)) != -1) {
        if (ch == 'h') {
            fputs(cmd->usage, stdout);
            return 1;
        }
        if (ch != 'c' && ch != 's' && (ch == '?' || !strchr(cmd->takes, ch))) {
            if (ch != '?') fprintf(stderr, "kinfer bench %s: option '%s' does not apply\n",
                                   cmd->name, argv[optind - 1]);
            fputs(cmd->usage, stderr);
            return -1;
        }
        int bad = 0;
        if (cli_config_opt(cc, ch, optarg)) continue;
        switch (ch) {
        case 'R': bad = opt_num("rate", optarg, 0, 1e7, &o->rate); break;
        case 'n': bad = opt_num("jobs", optarg, 1, 1e8, &v); o->jobs = (size_t)v; break;
        case 'r': bad = opt_num("rows", optarg, 1, 65536, &v); o->rows = (size_t)v; break;
        case 'w': bad = opt_num("width", optarg, 1, 1 << 20, &v); o->width = (size_t)v; break;
        case 'u': o->run = optarg; break;
        case 'f': o->from = optarg; break;
        case 'T': bad = opt_num("timeout", optarg, 0.1, 86400, &o->timeout_s); break;
        case 'N': o->no_fetch = 1; break;
        case 'b': o->batches = optarg; break;
        case 't': bad = opt_num("threads", optarg, 0, 1024, &v); o->threads = (int)v; break;
        case 'S': bad = opt_num("seconds", optarg, 0.01, 3600, &o->seconds); break;
        case 'P': bad = opt_num("pipeline", optarg, 1, 65536, &v); o->pipeline = (size_t)v; break;
        case 'D': o->dump = optarg; break;
        case 'e': bad = opt_num("parallel", optarg, 1, 256, &v); o->parallel = (size_t)v; break;
        case 'L': bad = opt_num("length", optarg, 3, 65536, &v); o->length = (size_t)v; break;
        case 'M': o->model = optarg; break;
        case 'K': bad = opt_num("steps", optarg, 1, 65536, &v); o->steps = (size_t)v; break;
        case 'm': o->sampling = optarg; break;
        }
        if (bad) return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer bench %s: unexpected argument '%s'\n", cmd->name, argv[optind]);
        return -1;
    }
    if (!bench_run_valid(o->run)) {
        fprintf(stderr, "kinfer bench %s: --run '%s': 1..%d of [A-Za-z0-9_-]\n", cmd->name,
                o->run, BENCH_RUN_MAX);
        return -1;
    }
    return 0;
}

/* Finds the subcommand, parses its options, loads the configuration once
 * (with the --set overrides, validated as the worker would) and runs it. */
int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(bench_usage, argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    const struct bench_cmd *cmd = NULL;
    for (size_t i = 0; i < sizeof(bench_cmds) / sizeof(bench_cmds[0]); i++)
        if (strcmp(argv[1], bench_cmds[i].name) == 0) cmd = &bench_cmds[i];
    if (!cmd) {
        fprintf(stderr, "kinfer bench: unknown command '%s'\n\n%s", argv[1], bench_usage);
        return 1;
    }
    struct bench_opts o = {.rows = 1, .run = "bench", .from = "redis", .timeout_s = 60,
                           .batches = "1,32,128", .seconds = 2, .jobs = 1000,
                           .parallel = 1};
    struct cli_config cc;
    if (cli_config_init(&cc, argc) < 0) return 1;
    int rc = parse_opts(cmd, argc - 1, argv + 1, &cc, &o);
    if (rc != 0) {
        cli_config_fini(&cc);
        return rc < 0 ? 1 : 0;
    }
    struct kcfg *c = cli_config_load("bench", &cc);
    if (!c) {
        cli_config_fini(&cc);
        return 1;
    }
    /* A server closing a socket must fail a write, not kill the tool. */
    signal(SIGPIPE, SIG_IGN);
    rc = cmd->run(c, &o);
    cfg_destroy(c);
    cli_config_fini(&cc);
    return rc;
}
