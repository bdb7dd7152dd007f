/* smoke.c (cmd/) - `kinfer smoke`: parses the options, loads the config,
 * installs the signal handlers and runs the end-to-end check
 * (tools/smoke.c's smoke_run) until it is done or a signal stops it.
 *
 * Threads: the main thread. */
#include <getopt.h>
#include <stdio.h>

#include "../tools/smoke.h"
#include "cli.h"
#include "commands.h"

static const char usage[] =
    "usage: kinfer smoke -c FILE [--set K=V]... [--model NAME] [--jobs N] [--rows K]\n"
    "                    [--json-every N] [--rate R] [--timeout S]\n"
    "\n"
    "Checks a running worker end to end: sends N jobs to the first input topic,\n"
    "waits for every result in Redis, compares each output with the model run\n"
    "locally, and prints jobs, batches, mean batch rows and latency. Jobs for a\n"
    "text encoder are texts of mixed length made from its vocabulary. A model\n"
    "that generates (its folder's config.json names a decoder) gets generation\n"
    "jobs (prompts and chats, some streamed with stop strings), each result\n"
    "and stream checked against the contract; it prints finish reasons,\n"
    "latency, time to first token and tokens/s. Exits 0 only if every job got\n"
    "a correct result.\n"
    "\n"
    "  -m, --model NAME     the model the jobs name (default: the default model)\n"
    "  -n, --jobs N         jobs to send (default 300)\n"
    "  -r, --rows K         rows per job (default 1; not for generation)\n"
    "  -j, --json-every N   every Nth job as JSON, the rest MessagePack (default 5; 0: none)\n"
    "  -R, --rate R         jobs per second (default 0: as fast as possible)\n"
    "  -T, --timeout S      seconds to wait for all results (default 60)\n";

/* `kinfer smoke`: options, config, then smoke_run until done or stopped. */
int cmd_smoke(int argc, char **argv)
{
    static const struct option opts[] = {
        CLI_CONFIG_OPTIONS,
        {"jobs", required_argument, 0, 'n'},   {"rows", required_argument, 0, 'r'},
        {"json-every", required_argument, 0, 'j'}, {"rate", required_argument, 0, 'R'},
        {"timeout", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'},
        {"model", required_argument, 0, 'm'},  {0, 0, 0, 0}};
    struct smoke_opts so = {.jobs = 300, .rows = 1, .json_every = 5, .timeout_s = 60};
    struct cli_config cc;
    int rc = 1, ch;
    long v;
    if (cli_config_init(&cc, argc) < 0) return 1;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:n:r:j:R:T:hm:", opts, NULL)) != -1) {
        if (cli_config_opt(&cc, ch, optarg)) continue;
        switch (ch) {
        case 'm': so.model = optarg; break;
        case 'n':
            if (cli_parse_long("smoke", "--jobs", optarg, 1, 10000000, &v) < 0) goto out;
            so.jobs = (size_t)v;
            break;
        case 'r':
            if (cli_parse_long("smoke", "--rows", optarg, 1, 65536, &v) < 0) goto out;
            so.rows = (size_t)v;
            break;
        case 'j':
            if (cli_parse_long("smoke", "--json-every", optarg, 0, 1000000, &v) < 0) goto out;
            so.json_every = (int)v;
            break;
        case 'R':
            if (cli_parse_long("smoke", "--rate", optarg, 0, 10000000, &v) < 0) goto out;
            so.rate = (int)v;
            break;
        case 'T':
            if (cli_parse_long("smoke", "--timeout", optarg, 1, 86400, &v) < 0) goto out;
            so.timeout_s = (int)v;
            break;
        case 'h': fputs(usage, stdout); rc = 0; goto out;
        default: fputs(usage, stderr); goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer smoke: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    struct kcfg *c = cli_config_load("smoke", &cc);
    if (!c) goto out;
    cli_install_signals();
    rc = smoke_run(c, &so, &cli_stop);
    cfg_destroy(c);
out:
    cli_config_fini(&cc);
    return rc;
}
