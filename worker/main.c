/* main.c - the kinfer binary: one program, subcommands. Parses the command
 * line, installs the signal handlers (they only set the stop flag, the one
 * global), and hands over to the module that does the work. Only main
 * decides the exit status.
 *
 * Threads: main thread. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/model.h"
#include "../tools/bench.h"
#include "../tools/broker.h"
#include "config.h"
#include "../telemetry/heartbeat.h"
#include "../telemetry/status.h"
#include "../telemetry/lag.h"
#include "log.h"
#include "replay.h"
#include "../tools/smoke.h"
#include "worker.h"

#ifndef KINFER_VERSION
#define KINFER_VERSION "dev"
#endif

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static const char usage_main[] =
    "usage: kinfer COMMAND [options]\n"
    "\n"
    "kinfer consumes inference jobs from Kafka, batches them, runs a model and\n"
    "publishes each result to a reply topic and to Redis.\n"
    "\n"
    "commands:\n"
    "  worker   run the worker:            kinfer worker -c worker.cfg\n"
    "  replay   recompute a range:         kinfer replay -c worker.cfg --from T --to T\n"
    "  lag      the group's lag:           kinfer lag -c worker.cfg [--json]\n"
    "  status   live workers (heartbeats): kinfer status -c worker.cfg [--json]\n"
    "  broker   run an embedded Kafka:     kinfer broker --topics jobs\n"
    "  smoke    check a running worker:    kinfer smoke -c worker.cfg\n"
    "  bench    load tools and floors:     kinfer bench --help (make bench runs them)\n"
    "  model    model tools:               kinfer model demo -o models/demo.safetensors\n"
    "\n"
    "  kinfer COMMAND --help   options of a command\n"
    "  kinfer --version        version and build\n";

static const char usage_worker[] =
    "usage: kinfer worker -c FILE [--set section.key=value]...\n"
    "\n"
    "Consumes jobs from kafka.topics, runs them in batches and publishes each\n"
    "result to kafka.reply_topic and Redis; stops cleanly on SIGTERM/SIGINT.\n"
    "\n"
    "  -c, --config FILE   configuration file (see worker.cfg for every setting)\n"
    "  -s, --set K=V       override one setting, e.g. --set batching.max_wait_ms=10\n"
    "\n"
    "exit status: 0 after a clean stop, 1 if it could not start, 2 on a fatal\n"
    "runtime error (restart it: unfinished jobs are redelivered).\n";

static const char usage_broker[] =
    "usage: kinfer broker [--brokers N] [--partitions P] [--topics a,b,c]\n"
    "\n"
    "Runs librdkafka's mock cluster: the Kafka protocol on loopback, for\n"
    "development and tests (no TLS/SASL; about 5 MB kept per partition).\n"
    "Prints the bootstrap address list as the first line of stdout and runs\n"
    "until SIGINT/SIGTERM.\n"
    "\n"
    "  -b, --brokers N      brokers in the cluster (default 1)\n"
    "  -p, --partitions P   partitions of each topic in --topics (default 4)\n"
    "  -t, --topics LIST    topics to create up front; others are auto-created\n";

static const char usage_smoke[] =
    "usage: kinfer smoke -c FILE [--set K=V]... [--jobs N] [--rows K]\n"
    "                    [--json-every N] [--rate R] [--timeout S]\n"
    "\n"
    "Checks a running worker end to end: sends N jobs to the first input topic,\n"
    "waits for every result in Redis, compares each output with the default\n"
    "model run locally, and prints jobs, batches, mean batch rows and latency.\n"
    "Exits 0 only if every job got a correct result.\n"
    "\n"
    "  -n, --jobs N         jobs to send (default 300)\n"
    "  -r, --rows K         rows per job (default 1)\n"
    "  -j, --json-every N   every Nth job as JSON, the rest MessagePack (default 5; 0: none)\n"
    "  -R, --rate R         jobs per second (default 0: as fast as possible)\n"
    "  -T, --timeout S      seconds to wait for all results (default 60)\n";

static const char usage_model[] =
    "usage: kinfer model demo -o PATH [--in N] [--hidden N] [--out N] [--seed S]\n"
    "\n"
    "Writes a small random MLP as safetensors (tensors 0.weight, 0.bias,\n"
    "2.weight, 2.bias: dense -> relu -> dense), the model worker.cfg names.\n"
    "\n"
    "  -o, --output PATH   file to write\n"
    "  --in N              input width (default 64)\n"
    "  --hidden N          hidden width (default 128)\n"
    "  --out N             output width (default 16)\n"
    "  --seed S            random seed (default 1)\n";

/* Parses a positive integer option; exits through the caller on error. */
static int parse_count(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kinfer: %s: '%s' is not an integer in %ld..%ld\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Loads the config for worker/smoke and applies its log settings. */
static struct kcfg *load_config(const char *path, const char **sets, size_t n_sets)
{
    if (!path) {
        fprintf(stderr, "kinfer: -c FILE is required\n");
        return NULL;
    }
    char err[1024];
    struct kcfg *c = cfg_load(path, sets, n_sets, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "kinfer: %s\n", err);
        return NULL;
    }
    log_level_parse(c->log.level, &log_threshold);
    log_fmt = strcmp(c->log.format, "json") == 0 ? LOG_JSON : LOG_TEXT;
    return c;
}

/* Shared parser for the commands that take -c and --set (worker, smoke). */
static int cmd_with_config(int argc, char **argv, int smoke)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"set", required_argument, 0, 's'},
        {"jobs", required_argument, 0, 'n'},   {"rows", required_argument, 0, 'r'},
        {"json-every", required_argument, 0, 'j'}, {"rate", required_argument, 0, 'R'},
        {"timeout", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *path = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof(char *));
    size_t n_sets = 0;
    struct smoke_opts so = {.jobs = 300, .rows = 1, .json_every = 5, .timeout_s = 60};
    int rc = 1, ch;
    long v;
    if (!sets) return 1;
    while ((ch = getopt_long(argc, argv, smoke ? "c:s:n:r:j:R:T:h" : "c:s:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': path = optarg; break;
        case 's': sets[n_sets++] = optarg; break;
        case 'n': if (parse_count("--jobs", optarg, 1, 10000000, &v) < 0) goto out; so.jobs = (size_t)v; break;
        case 'r': if (parse_count("--rows", optarg, 1, 65536, &v) < 0) goto out; so.rows = (size_t)v; break;
        case 'j': if (parse_count("--json-every", optarg, 0, 1000000, &v) < 0) goto out; so.json_every = (int)v; break;
        case 'R': if (parse_count("--rate", optarg, 0, 10000000, &v) < 0) goto out; so.rate = (int)v; break;
        case 'T': if (parse_count("--timeout", optarg, 1, 86400, &v) < 0) goto out; so.timeout_s = (int)v; break;
        case 'h': fputs(smoke ? usage_smoke : usage_worker, stdout); rc = 0; goto out;
        default: fputs(smoke ? usage_smoke : usage_worker, stderr); goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    struct kcfg *c = load_config(path, sets, n_sets);
    if (!c) goto out;
    install_signals();
    rc = smoke ? smoke_run(c, &so, &stop_flag) : (int)worker_run(c, NULL, &stop_flag);
    cfg_destroy(c);
out:
    free(sets);
    return rc;
}

static int cmd_broker(int argc, char **argv)
{
    static const struct option opts[] = {
        {"brokers", required_argument, 0, 'b'}, {"partitions", required_argument, 0, 'p'},
        {"topics", required_argument, 0, 't'},  {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    struct broker_opts o = {.brokers = 1, .partitions = 4, .topics = NULL};
    int ch;
    long v;
    while ((ch = getopt_long(argc, argv, "b:p:t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'b': if (parse_count("--brokers", optarg, 1, 32, &v) < 0) return 1; o.brokers = (int)v; break;
        case 'p': if (parse_count("--partitions", optarg, 1, 1024, &v) < 0) return 1; o.partitions = (int)v; break;
        case 't': o.topics = optarg; break;
        case 'h': fputs(usage_broker, stdout); return 0;
        default: fputs(usage_broker, stderr); return 1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer broker: unexpected argument '%s'\n", argv[optind]);
        return 1;
    }
    install_signals();
    return broker_run(&o, &stop_flag);
}

static int cmd_model(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage_model, argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    if (strcmp(argv[1], "demo") != 0) {
        fprintf(stderr, "kinfer model: unknown subcommand '%s'\n%s", argv[1], usage_model);
        return 1;
    }
    static const struct option opts[] = {
        {"output", required_argument, 0, 'o'}, {"in", required_argument, 0, 'i'},
        {"hidden", required_argument, 0, 'H'}, {"out", required_argument, 0, 'O'},
        {"seed", required_argument, 0, 'S'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *path = NULL;
    long in = 64, hidden = 128, out = 16, seed = 1;
    int ch;
    argc--, argv++;
    while ((ch = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': path = optarg; break;
        case 'i': if (parse_count("--in", optarg, 1, 1 << 20, &in) < 0) return 1; break;
        case 'H': if (parse_count("--hidden", optarg, 1, 1 << 20, &hidden) < 0) return 1; break;
        case 'O': if (parse_count("--out", optarg, 1, 1 << 20, &out) < 0) return 1; break;
        case 'S': if (parse_count("--seed", optarg, 0, 1L << 40, &seed) < 0) return 1; break;
        case 'h': fputs(usage_model, stdout); return 0;
        default: fputs(usage_model, stderr); return 1;
        }
    }
    if (!path) {
        fprintf(stderr, "kinfer model demo: -o PATH is required\n");
        return 1;
    }
    char err[512];
    if (model_write_demo(path, (size_t)in, (size_t)hidden, (size_t)out, (uint64_t)seed,
                         err, sizeof(err)) < 0) {
        fprintf(stderr, "kinfer model demo: %s\n", err);
        return 1;
    }
    printf("wrote %s: dense %ld->%ld, relu, dense %ld->%ld\n", path, in, hidden, hidden, out);
    return 0;
}

static void print_version(void)
{
    char cuda[512];
    model_cuda_describe(cuda, sizeof(cuda));
    printf("kinfer %s\n%s\n", KINFER_VERSION, cuda);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return 1;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        print_version();
        return 0;
    }
    if (strcmp(cmd, "worker") == 0) return cmd_with_config(argc - 1, argv + 1, 0);
    if (strcmp(cmd, "smoke") == 0) return cmd_with_config(argc - 1, argv + 1, 1);
    if (strcmp(cmd, "broker") == 0) return cmd_broker(argc - 1, argv + 1);
    if (strcmp(cmd, "replay") == 0) return replay_main(argc - 1, argv + 1);
    if (strcmp(cmd, "lag") == 0) return lag_main(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0) return status_main(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return bench_main(argc - 1, argv + 1);
    if (strcmp(cmd, "model") == 0) return cmd_model(argc - 1, argv + 1);
    fprintf(stderr, "kinfer: unknown command '%s'\n\n%s", cmd, usage_main);
    return 1;
}
