/* model.c (cmd/) - `kinfer model`: model tools. `kinfer model demo`
 * writes the demo MLP that worker.cfg names (gpu/model.h's
 * model_write_demo), or with --kind bert, roberta, xlm-roberta, mpnet or
 * distilbert a
 * small random encoder folder of that family (model_write_demo_encoder)
 * for text jobs, or with --kind llama a small random decoder folder
 * (gpu/decoder.h's decoder_write_demo_tok) for generation jobs, its
 * tokenizer byte-level BPE or, with --tokenizer sentencepiece, Llama 2's
 * SentencePiece BPE with byte fallback.
 *
 * Threads: the main thread. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../gpu/decoder.h"
#include "../gpu/model.h"
#include "cli.h"
#include "commands.h"

static const char usage[] =
    "usage: kinfer model demo -o PATH\n"
    "       [--kind mlp|bert|roberta|xlm-roberta|mpnet|distilbert|nomic-bert|llama] [options]\n"
    "\n"
    "--kind mlp (default) writes a small random MLP as safetensors (tensors\n"
    "0.weight, 0.bias, 2.weight, 2.bias: dense -> relu -> dense), the model\n"
    "worker.cfg names. --kind bert (roberta, xlm-roberta, mpnet, distilbert, nomic-bert)\n"
    "writes a small random encoder folder of that family as Hugging Face and\n"
    "sentence-transformers lay it out (config.json with the family's keys,\n"
    "model.safetensors with its tensor names, a WordPiece vocab.txt or for\n"
    "roberta a byte-level BPE tokenizer.json, for xlm-roberta a Unigram one,\n"
    "mean pooling, normalized), or with --labels N a sequence classifier\n"
    "(--labels 1: a cross-encoder, sigmoid scores). --kind llama writes a\n"
    "small random Llama decoder folder (config.json, generation_config.json,\n"
    "model.safetensors, a byte-level BPE tokenizer.json, tokenizer_config.json\n"
    "with a ChatML chat_template; with --tokenizer sentencepiece a Llama 2 /\n"
    "Mistral SentencePiece BPE with byte fallback, <s> in front of every text\n"
    "and an [INST] chat_template). Point a model's path at it.\n"
    "\n"
    "  -o, --output PATH   file (mlp) or folder (bert) to write\n"
    "  --seed S            random seed (default 1)\n"
    "mlp:\n"
    "  --in N              input width (default 64)\n"
    "  --hidden N          hidden width (default 128)\n"
    "  --out N             output width (default 16)\n"
    "encoders:\n"
    "  --layers N          encoder layers (default 2)\n"
    "  --hidden N          hidden size (default 64)\n"
    "  --heads N           attention heads (default 4)\n"
    "  --intermediate N    feed-forward size (default 4 x hidden)\n"
    "llama: --layers, --hidden, --heads, --intermediate as encoders, and\n"
    "  --kv-heads N        key/value heads (default heads / 2 when even)\n"
    "  --tokenizer T       bytelevel (default) or sentencepiece\n"
    "  --vocab N           vocabulary rows, at least the tokenizer's (default: its)\n"
    "  --dtype f32|bf16    the weights' type in model.safetensors (default f32)\n"
    "  --labels N          a classifier with N labels (default 0: embeddings)\n";

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
        {"kind", required_argument, 0, 'k'},   {"layers", required_argument, 0, 'L'},
        {"heads", required_argument, 0, 'A'},  {"intermediate", required_argument, 0, 'I'},
        {"labels", required_argument, 0, 'C'}, {"kv-heads", required_argument, 0, 'K'},
        {"tokenizer", required_argument, 0, 'T'}, {"vocab", required_argument, 0, 'V'},
        {"dtype", required_argument, 0, 'D'},  {0, 0, 0, 0}};
    const char *path = NULL, *kind = "mlp", *tokenizer = NULL, *dtype = "f32";
    long in = 64, hidden = -1, out = 16, seed = 1, vocab = 0;
    long layers = 2, heads = 4, inter = 0, labels = 0, kv_heads = 0;
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
        case 'k': kind = optarg; break;
        case 'T': tokenizer = optarg; break;
        case 'L': if (cli_parse_long("model", "--layers", optarg, 1, 64, &layers) < 0) return 1; break;
        case 'A': if (cli_parse_long("model", "--heads", optarg, 1, 256, &heads) < 0) return 1; break;
        case 'I': if (cli_parse_long("model", "--intermediate", optarg, 1, 16384, &inter) < 0) return 1; break;
        case 'C': if (cli_parse_long("model", "--labels", optarg, 0, 64, &labels) < 0) return 1; break;
        case 'K': if (cli_parse_long("model", "--kv-heads", optarg, 1, 256, &kv_heads) < 0) return 1; break;
        case 'V': if (cli_parse_long("model", "--vocab", optarg, 1, 1 << 20, &vocab) < 0) return 1; break;
        case 'D': dtype = optarg; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 1;
        }
    }
    if (!path) {
        fprintf(stderr, "kinfer model demo: -o PATH is required\n");
        return 1;
    }
    char err[512];
    if (tokenizer && strcmp(kind, "llama") != 0) {
        fprintf(stderr, "kinfer model demo: --tokenizer is for --kind llama\n");
        return 1;
    }
    if (strcmp(kind, "llama") == 0) {
        int sp = tokenizer && strcmp(tokenizer, "sentencepiece") == 0;
        if (tokenizer && !sp && strcmp(tokenizer, "bytelevel") != 0) {
            fprintf(stderr, "kinfer model demo: --tokenizer '%s': bytelevel or sentencepiece\n",
                    tokenizer);
            return 1;
        }
        if (hidden < 0) hidden = 64;
        if (!inter) inter = 3 * hidden;
        if (!kv_heads) kv_heads = heads % 2 ? heads : heads / 2;
        if (strcmp(dtype, "f32") != 0 && strcmp(dtype, "bf16") != 0) {
            fprintf(stderr, "kinfer model demo: --dtype '%s': f32 or bf16\n", dtype);
            return 1;
        }
        struct decoder_demo_conf dc = {
            .layers = (size_t)layers, .hidden = (size_t)hidden, .heads = (size_t)heads,
            .kv_heads = (size_t)kv_heads, .inter = (size_t)inter, .vocab = (size_t)vocab,
            .bf16 = strcmp(dtype, "bf16") == 0, .seed = (uint64_t)seed,
            .tok = sp ? DECODER_DEMO_SENTENCEPIECE : DECODER_DEMO_BYTELEVEL};
        if (decoder_write_demo_ex(path, &dc, err, sizeof(err)) < 0) {
            fprintf(stderr, "kinfer model demo: %s\n", err);
            return 1;
        }
        printf("wrote %s/: llama decoder, %ld layers, hidden %ld, %ld heads (%ld key/value), "
               "intermediate %ld, %s, %s tokenizer\n", path, layers, hidden, heads, kv_heads,
               inter, dtype, sp ? "SentencePiece BPE" : "byte-level BPE");
        return 0;
    }
    if (strcmp(kind, "mlp") != 0) {
        if (hidden < 0) hidden = 64;
        if (!inter) inter = 4 * hidden;
        if (model_write_demo_encoder(path, kind, (size_t)layers, (size_t)hidden, (size_t)heads,
                                     (size_t)inter, (size_t)labels, (uint64_t)seed, err,
                                     sizeof(err)) < 0) {
            fprintf(stderr, "kinfer model demo: %s\n", err);
            return 1;
        }
        printf("wrote %s/: %s, %ld layers, hidden %ld, %ld heads, intermediate %ld, %s\n",
               path, kind, layers, hidden, heads, inter,
               labels ? "sequence classifier" : "mean-pooled normalized embeddings");
        return 0;
    }
    if (hidden < 0) hidden = 128;
    if (model_write_demo(path, (size_t)in, (size_t)hidden, (size_t)out, (uint64_t)seed,
                         err, sizeof(err)) < 0) {
        fprintf(stderr, "kinfer model demo: %s\n", err);
        return 1;
    }
    printf("wrote %s: dense %ld->%ld, relu, dense %ld->%ld\n", path, in, hidden, hidden, out);
    return 0;
}
