/* model.c (cmd/) - `kinfer model`: model tools. `kinfer model demo`
 * writes the demo MLP that worker.cfg names (gpu/model.h's
 * model_write_demo).
 *
 * Threads: the main thread. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../gpu/model.h"
#include "cli.h"
#include "commands.h"

static const char usage[] =
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

int cmd_model(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    if (strcmp(argv[1], "demo") != 0) {
        fprintf(stderr, "kinfer model: unknown subcommand '%s'\n%s", argv[1], usage);
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
    optind = 1;
    while ((ch = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': path = optarg; break;
        case 'i': if (cli_parse_long("model", "--in", optarg, 1, 1 << 20, &in) < 0) return 1; break;
        case 'H': if (cli_parse_long("model", "--hidden", optarg, 1, 1 << 20, &hidden) < 0) return 1; break;
        case 'O': if (cli_parse_long("model", "--out", optarg, 1, 1 << 20, &out) < 0) return 1; break;
        case 'S': if (cli_parse_long("model", "--seed", optarg, 0, 1L << 40, &seed) < 0) return 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 1;
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
