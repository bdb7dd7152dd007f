/* demo.c - the demo models of gpu/model.h: model_write_demo (a 2-layer
 * MLP as a safetensors file) and model_write_demo_encoder (a small BERT,
 * RoBERTa, XLM-R, MPNet or DistilBERT folder as Hugging Face and
 * sentence-transformers lay it out, with each family's config keys and
 * tensor names). Both are
 * written with st_write, so the normal load paths read them, and both
 * draw their weights from one seeded generator: the same seed, the same
 * bytes.
 *
 * Threads: any; nothing is shared. */
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "demo.h"
#include "safetensors.h"

/* ---- the generator --------------------------------------------------------- */

/* splitmix64: a tiny, well-mixed generator so the demo weights depend only
 * on the seed, not on libc's rand. */
static uint64_t demo_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-bound, bound). */
float demo_uniform(uint64_t *s, float bound)
{
    double u = (double)(demo_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)((2.0 * u - 1.0) * bound);
}

/* Generates weights in memory and writes them with st_write, so the demo
 * file is a real safetensors file the normal load path reads. */
int model_write_demo(const char *path, size_t in, size_t hidden, size_t out,
                     uint64_t seed, char *errstr, size_t errstr_size)
{
    if (in == 0 || hidden == 0 || out == 0 || in > INT_MAX || hidden > INT_MAX ||
        out > INT_MAX || hidden > SIZE_MAX / sizeof(float) / (in > out ? in : out)) {
        snprintf(errstr, errstr_size, "model demo: bad sizes in=%zu hidden=%zu out=%zu", in,
                 hidden, out);
        return -1;
    }
    int rc = -1;
    float *w0 = malloc(hidden * in * sizeof(float));
    float *b0 = malloc(hidden * sizeof(float));
    float *w2 = malloc(out * hidden * sizeof(float));
    float *b2 = malloc(out * sizeof(float));
    if (!w0 || !b0 || !w2 || !b2) {
        snprintf(errstr, errstr_size, "model demo: out of memory");
        goto fail;
    }
    uint64_t s = seed;
    float bound0 = 1.0f / sqrtf((float)in), bound2 = 1.0f / sqrtf((float)hidden);
    for (size_t i = 0; i < hidden * in; i++) w0[i] = demo_uniform(&s, bound0);
    for (size_t i = 0; i < hidden; i++) b0[i] = demo_uniform(&s, bound0);
    for (size_t i = 0; i < out * hidden; i++) w2[i] = demo_uniform(&s, bound2);
    for (size_t i = 0; i < out; i++) b2[i] = demo_uniform(&s, bound2);
    uint64_t sw0[2] = {hidden, in}, sb0[1] = {hidden}, sw2[2] = {out, hidden}, sb2[1] = {out};
    struct st_write_tensor t[4] = {
        {"0.weight", ST_F32, 2, sw0, w0},
        {"0.bias", ST_F32, 1, sb0, b0},
        {"2.weight", ST_F32, 2, sw2, w2},
        {"2.bias", ST_F32, 1, sb2, b2},
    };
    rc = st_write(path, t, 4, errstr, errstr_size);
fail:
    free(w0);
    free(b0);
    free(w2);
    free(b2);
    return rc;
}

/* ---- the encoder folders ------------------------------------------------------ */

/* dir/name into buf; 0, or -1 when it does not fit. */
int demo_path_in(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The demo vocabulary: specials, letters, digits, punctuation, a few
 * hundred common English words and ## pieces. */
static const char *const demo_words[] = {
    "the", "a", "an", "of", "to", "and", "in", "is", "it", "that", "for", "on", "with", "as",
    "was", "he", "she", "they", "we", "you", "i", "this", "be", "at", "by", "not", "are", "or",
    "have", "from", "but", "what", "all", "were", "when", "there", "can", "more", "if", "no",
    "out", "so", "up", "said", "about", "one", "two", "three", "new", "time", "good", "bad",
    "great", "love", "like", "hate", "movie", "film", "book", "story", "food", "service",
    "price", "product", "quality", "fast", "slow", "happy", "sad", "kafka", "redis", "gpu",
    "worker", "job", "result", "model", "text", "search", "query", "document", "page", "user",
    "day", "night", "world", "city", "car", "house", "water", "work", "play", "read", "write",
    "run", "walk", "see", "look", "find", "make", "take", "give", "get", "go", "come", "know",
    "think", "say", "very", "really", "not", "never", "always", "best", "worst", "ok", "fine",
    "##s", "##ed", "##ing", "##ly", "##er", "##est", "##ness", "##ful", "##less", "##able",
    "##tion", "##ment", "##al", "##ic", "##y", "##e", "##a", "##o", "##i", "##n", "##t", "##r",
};

int demo_write_text(const char *path, const char *text, char *errstr, size_t errstr_size)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        snprintf(errstr, errstr_size, "%s: %s", path, strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    return 0;
}

int demo_write_json(const char *dir, const char *name, const json_t *j, size_t flags,
                    char *errstr, size_t errstr_size)
{
    char path[4200];
    char *text = j ? json_dumps(j, flags) : NULL;
    if (!text) {
        snprintf(errstr, errstr_size, "%s: out of memory writing %s", dir, name);
        return -1;
    }
    int rc = demo_path_in(path, sizeof(path), dir, name) < 0
                 ? (snprintf(errstr, errstr_size, "%s: path too long", dir), -1)
                 : demo_write_text(path, text, errstr, errstr_size);
    free(text);
    return rc;
}

/* UTF-8 of GPT-2's byte character for byte b (bytes_to_unicode: printable
 * Latin-1 bytes are themselves, the other 68 take U+0100 on). */
static size_t demo_byte_char(int b, char out[3])
{
    int k = 0, cp = b;
    int keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (!keep) {
        for (int x = 0; x < b; x++)
            k += !((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae);
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = '\0';
    return 2;
}

int demo_bpe_write(const char *dir, const char *const *specials, size_t n_specials,
                   json_t *post, size_t *vocab, char *errstr, size_t errstr_size)
{
    int rc = -1;
    json_t *v = json_object(), *merges = json_array(), *root = NULL;
    if (!v || !merges) goto oom;
    size_t n = 0;
    for (size_t i = 0; i < n_specials; i++)
        if (json_object_set_new(v, specials[i], json_integer((json_int_t)n++))) goto oom;
    for (int b = 0; b < 256; b++) {
        char c[3];
        demo_byte_char(b, c);
        if (json_object_set_new(v, c, json_integer((json_int_t)n++))) goto oom;
    }
    for (size_t w = 0; w < sizeof(demo_words) / sizeof(demo_words[0]); w++) {
        const char *word = demo_words[w];
        if (!strncmp(word, "##", 2)) continue;
        for (int sp = 0; sp < 2; sp++) {
            char form[64], prev[64];
            size_t fl = 0;
            if (sp) fl = demo_byte_char(' ', form);
            for (const char *q = word; *q && fl + 3 < sizeof(form); q++)
                fl += demo_byte_char((unsigned char)*q, form + fl);
            form[fl] = '\0';
            /* the chain: prefix + next character, each a merge */
            size_t first = ((unsigned char)form[0] & 0x80) ? 2 : 1, at = first;
            memcpy(prev, form, first);
            prev[first] = '\0';
            while (at < fl) {
                char next[64], m[160];
                size_t cl = ((unsigned char)form[at] & 0x80) ? 2 : 1;
                memcpy(next, form + at, cl);
                next[cl] = '\0';
                snprintf(m, sizeof(m), "%s %s", prev, next);
                memcpy(prev, form, at + cl);
                prev[at + cl] = '\0';
                at += cl;
                if (json_object_get(v, prev)) continue;
                if (json_object_set_new(v, prev, json_integer((json_int_t)n++)) ||
                    json_array_append_new(merges, json_string(m)))
                    goto oom;
            }
        }
    }
    static const char bl[] =
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
        "\"use_regex\": true}";
    json_error_t jerr;
    root = json_loads("{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, "
                      "\"added_tokens\": [], \"normalizer\": null}", 0, &jerr);
    json_t *added = json_object_get(root, "added_tokens");
    if (!root) goto oom;
    for (size_t i = 0; i < n_specials; i++)
        if (json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (int)i, "content", specials[i],
                                                   "single_word", 0, "lstrip",
                                                   !strcmp(specials[i], "<mask>"), "rstrip", 0,
                                                   "normalized", 0, "special", 1)))
            goto oom;
    if (json_object_set_new(root, "pre_tokenizer", json_loads(bl, 0, &jerr)) ||
        json_object_set(root, "post_processor", post ? post : json_null()) ||
        json_object_set_new(root, "decoder", json_loads(bl, 0, &jerr)) ||
        json_object_set_new(root, "model",
                            json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:O, s:O}", "type",
                                      "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                                      "", "end_of_word_suffix", "", "fuse_unk", 0,
                                      "byte_fallback", 0, "vocab", v, "merges", merges)))
        goto oom;
    if (demo_write_json(dir, "tokenizer.json", root, JSON_PRESERVE_ORDER | JSON_COMPACT, errstr,
                        errstr_size) < 0)
        goto out;
    *vocab = n;
    rc = 0;
    goto out;
oom:
    snprintf(errstr, errstr_size, "%s: out of memory writing tokenizer.json", dir);
out:
    json_decref(root);
    json_decref(v);
    json_decref(post);
    json_decref(merges);
    return rc;
}

int demo_sp_write(const char *dir, size_t *vocab, char *errstr, size_t errstr_size)
{
    static const char sp[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */
    static const char *const specials[] = {"<unk>", "<s>", "</s>"};
    int rc = -1;
    json_t *v = json_object(), *merges = json_array(), *root = NULL;
    if (!v || !merges) goto oom;
    size_t n = 0;
    for (size_t i = 0; i < 3; i++)
        if (json_object_set_new(v, specials[i], json_integer((json_int_t)n++))) goto oom;
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof(t), "<0x%02X>", b);
        if (json_object_set_new(v, t, json_integer((json_int_t)n++))) goto oom;
    }
    if (json_object_set_new(v, sp, json_integer((json_int_t)n++))) goto oom;
    for (int c = 33; c < 127; c++) {
        char one[2] = {(char)c, '\0'};
        if (json_object_set_new(v, one, json_integer((json_int_t)n++))) goto oom;
    }
    for (size_t w = 0; w < sizeof(demo_words) / sizeof(demo_words[0]); w++) {
        const char *word = demo_words[w];
        if (!strncmp(word, "##", 2)) continue;
        /* the word by a chain of merges (prefix + next character), then
         * "▁" + the word by one more */
        char prev[64], next[2] = {0, 0}, merged[64];
        prev[0] = word[0];
        prev[1] = '\0';
        for (const char *q = word + 1;; q++) {
            int last = *q == '\0';
            const char *l = last ? sp : prev, *r = last ? prev : next;
            next[0] = *q;
            snprintf(merged, sizeof(merged), "%s%s", l, r);
            if (!json_object_get(v, merged) &&
                (json_object_set_new(v, merged, json_integer((json_int_t)n++)) ||
                 json_array_append_new(merges, json_pack("[s, s]", l, r))))
                goto oom;
            if (last) break;
            memcpy(prev, merged, strlen(merged) + 1);
        }
    }
    json_error_t jerr;
    root = json_loads(
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"normalizer\": null,"
        " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\","
        " \"prepend_scheme\": \"first\", \"split\": false},"
        " \"post_processor\": {\"type\": \"TemplateProcessing\","
        " \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
        " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
        " \"pair\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
        " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
        " {\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 1}},"
        " {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}],"
        " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
        " \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
        " {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},"
        " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
        " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}",
        0, &jerr);
    json_t *added = json_array();
    if (!root || !added || json_object_set_new(root, "added_tokens", added)) goto oom;
    for (size_t i = 0; i < 3; i++)
        if (json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (int)i, "content", specials[i],
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special", 1)))
            goto oom;
    if (json_object_set_new(root, "model",
                            json_pack("{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:b, s:O, s:O}", "type",
                                      "BPE", "dropout", "unk_token", "<unk>",
                                      "continuing_subword_prefix", "end_of_word_suffix",
                                      "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0,
                                      "vocab", v, "merges", merges)))
        goto oom;
    if (demo_write_json(dir, "tokenizer.json", root, JSON_PRESERVE_ORDER | JSON_COMPACT, errstr,
                        errstr_size) < 0)
        goto out;
    *vocab = n;
    rc = 0;
    goto out;
oom:
    snprintf(errstr, errstr_size, "%s: out of memory writing tokenizer.json", dir);
out:
    json_decref(root);
    json_decref(v);
    json_decref(merges);
    return rc;
}

/* XLM-R's tokenizer as Hugging Face saves it: tokenizer.json with a
 * SentencePiece Unigram model (<s> <pad> </s> <unk> first, <mask> last;
 * then the word boundary U+2581, letters, digits and punctuation, each
 * demo word bare and after the boundary, whole words scored above their
 * letters), NFKC, Metaspace and RobertaProcessing. *vocab gets the number
 * of ids. */
static int demo_unigram_tokenizer(const char *dir, size_t *vocab, char *errstr,
                                  size_t errstr_size)
{
    int rc = -1;
    json_t *root = NULL, *v = json_array(), *seen = json_object();
    if (!v || !seen) goto oom;
    static const char *const specials[] = {"<s>", "<pad>", "</s>", "<unk>"};
#define PIECE(str, score)                                                                  \
    do {                                                                                   \
        if (!json_object_get(seen, (str)) &&                                               \
            (json_object_set_new(seen, (str), json_true()) ||                              \
             json_array_append_new(v, json_pack("[s, f]", (str), (double)(score)))))      \
            goto oom;                                                                      \
    } while (0)
    for (size_t i = 0; i < 4; i++) PIECE(specials[i], 0.0);
    PIECE("\xe2\x96\x81", -2.0);
    for (int c = 33; c < 127; c++) {
        char one[2] = {(char)c, '\0'};
        PIECE(one, -8.0 - (double)(c % 7) / 8.0);
    }
    for (size_t w = 0; w < sizeof(demo_words) / sizeof(demo_words[0]); w++) {
        const char *word = demo_words[w];
        if (!strncmp(word, "##", 2) || strlen(word) < 2) continue;
        char sp[64];
        snprintf(sp, sizeof(sp), "\xe2\x96\x81%s", word);
        PIECE(sp, -5.0 - (double)(w % 13) / 16.0);
        PIECE(word, -6.0 - (double)(w % 11) / 16.0);
    }
    PIECE("<mask>", 0.0);
#undef PIECE
    size_t n = json_array_size(v);
    static const char ms[] = "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", "
                             "\"prepend_scheme\": \"always\", \"split\": true}";
    json_error_t jerr;
    root = json_loads("{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, "
                      "\"added_tokens\": [], \"normalizer\": {\"type\": \"NFKC\"}}", 0, &jerr);
    if (!root) goto oom;
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; i < 5; i++)
        if (json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (int)(i < 4 ? i : n - 1), "content",
                                                   i < 4 ? specials[i] : "<mask>", "single_word",
                                                   0, "lstrip", i == 4, "rstrip", 0,
                                                   "normalized", 0, "special", 1)))
            goto oom;
    if (json_object_set_new(root, "pre_tokenizer", json_loads(ms, 0, &jerr)) ||
        json_object_set_new(root, "post_processor",
                            json_pack("{s:s, s:[s, i], s:[s, i], s:b, s:b}", "type",
                                      "RobertaProcessing", "sep", "</s>", 2, "cls", "<s>", 0,
                                      "trim_offsets", 1, "add_prefix_space", 1)) ||
        json_object_set_new(root, "decoder", json_loads(ms, 0, &jerr)) ||
        json_object_set_new(root, "model",
                            json_pack("{s:s, s:i, s:O, s:b}", "type", "Unigram", "unk_id", 3,
                                      "vocab", v, "byte_fallback", 0)))
        goto oom;
    if (demo_write_json(dir, "tokenizer.json", root, JSON_PRESERVE_ORDER | JSON_COMPACT, errstr,
                        errstr_size) < 0)
        goto out;
    *vocab = n;
    rc = 0;
    goto out;
oom:
    snprintf(errstr, errstr_size, "%s: out of memory writing tokenizer.json", dir);
out:
    json_decref(root);
    json_decref(v);
    json_decref(seen);
    return rc;
}

/* What a family's folder holds: its config.json keys, architectures,
 * vocabulary specials and tensor names (as Hugging Face saves them; a
 * classifier's encoder tensors under the family's prefix, except BERT's,
 * which the demo has always written bare). */
struct demo_family {
    const char *kind, *model_type, *embedder, *classifier;
    const char *prefix;                 /* a classifier's encoder tensors */
    const char *layer;                  /* "encoder.layer." */
    const char *mod[8];                 /* q, k, v, attention out, LN, ffn in, out, LN */
    size_t type_vocab;                  /* 0: no type table */
    size_t pos_base;                    /* position rows before the first token's */
    int rel_bias;                       /* MPNet's encoder.relative_attention_bias */
    const char *cls_pre, *cls_out;
    int bos_specials;                   /* <s> <pad> </s> <unk> <mask>, else [PAD]... */
};

static const struct demo_family demo_families[] = {
    {"bert", "bert", "BertModel", "BertForSequenceClassification", "", "encoder.layer.",
     {"attention.self.query", "attention.self.key", "attention.self.value",
      "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
      "output.dense", "output.LayerNorm"},
     2, 0, 0, "pooler.dense", "classifier", 0},
    {"roberta", "roberta", "RobertaModel", "RobertaForSequenceClassification", "roberta.",
     "encoder.layer.",
     {"attention.self.query", "attention.self.key", "attention.self.value",
      "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
      "output.dense", "output.LayerNorm"},
     1, 2, 0, "classifier.dense", "classifier.out_proj", 1},
    {"xlm-roberta", "xlm-roberta", "XLMRobertaModel", "XLMRobertaForSequenceClassification",
     "roberta.", "encoder.layer.",
     {"attention.self.query", "attention.self.key", "attention.self.value",
      "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
      "output.dense", "output.LayerNorm"},
     1, 2, 0, "classifier.dense", "classifier.out_proj", 1},
    {"mpnet", "mpnet", "MPNetModel", "MPNetForSequenceClassification", "mpnet.",
     "encoder.layer.",
     {"attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
      "attention.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"},
     0, 2, 1, "classifier.dense", "classifier.out_proj", 1},
    {"distilbert", "distilbert", "DistilBertModel", "DistilBertForSequenceClassification",
     "distilbert.", "transformer.layer.",
     {"attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
      "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm"},
     0, 0, 0, "pre_classifier", "classifier", 0},
    /* NomicBERT: its own config keys and tensors (demo_config,
     * demo_nomic_tensors); an embedder only. */
    {"nomic-bert", "nomic_bert", "NomicBertModel", NULL, "", "encoder.layers.",
     {NULL}, 2, 0, 0, NULL, NULL, 0},
};

/* The demo's position rows for its 128 tokens. */
#define DEMO_MAX_TOKENS 128

const char *model_demo_encoder_kinds(void)
{
    return "bert, roberta, xlm-roberta, mpnet, distilbert, nomic-bert";
}

/* config.json of family f into buf. */
static void demo_config(const struct demo_family *f, char *buf, size_t cap, size_t vocab,
                        size_t layers, size_t hidden, size_t heads, size_t inter,
                        size_t n_labels)
{
    const char *arch = n_labels ? f->classifier : f->embedder;
    int n;
    if (!strcmp(f->kind, "distilbert"))
        n = snprintf(buf, cap,
                     "{\n  \"model_type\": \"distilbert\",\n  \"architectures\": [\"%s\"],\n"
                     "  \"vocab_size\": %zu,\n  \"dim\": %zu,\n  \"n_layers\": %zu,\n"
                     "  \"n_heads\": %zu,\n  \"hidden_dim\": %zu,\n"
                     "  \"activation\": \"gelu\",\n  \"max_position_embeddings\": %d,\n"
                     "  \"sinusoidal_pos_embds\": false,\n  \"pad_token_id\": 0",
                     arch, vocab, hidden, layers, heads, inter, DEMO_MAX_TOKENS);
    else if (!strcmp(f->kind, "nomic-bert"))
        n = snprintf(buf, cap,
                     "{\n  \"model_type\": \"nomic_bert\",\n  \"architectures\": [\"%s\"],\n"
                     "  \"vocab_size\": %zu,\n  \"n_embd\": %zu,\n  \"n_layer\": %zu,\n"
                     "  \"n_head\": %zu,\n  \"n_inner\": %zu,\n"
                     "  \"activation_function\": \"swiglu\",\n  \"n_positions\": %d,\n"
                     "  \"type_vocab_size\": 2,\n  \"layer_norm_epsilon\": 1e-12,\n"
                     "  \"rotary_emb_base\": 1000,\n  \"rotary_emb_fraction\": 1.0,\n"
                     "  \"rotary_emb_interleaved\": false,\n  \"rotary_scaling_factor\": null,\n"
                     "  \"prenorm\": false,\n  \"qkv_proj_bias\": false,\n"
                     "  \"mlp_fc1_bias\": false,\n  \"mlp_fc2_bias\": false",
                     arch, vocab, hidden, layers, heads, inter, DEMO_MAX_TOKENS);
    else if (!strcmp(f->kind, "bert"))
        n = snprintf(buf, cap,
                     "{\n  \"model_type\": \"bert\",\n  \"architectures\": [\"%s\"],\n"
                     "  \"vocab_size\": %zu,\n  \"hidden_size\": %zu,\n  \"num_hidden_layers\": %zu,\n"
                     "  \"num_attention_heads\": %zu,\n  \"intermediate_size\": %zu,\n"
                     "  \"hidden_act\": \"gelu\",\n  \"max_position_embeddings\": %d,\n"
                     "  \"type_vocab_size\": 2,\n  \"layer_norm_eps\": 1e-12,\n"
                     "  \"position_embedding_type\": \"absolute\"",
                     arch, vocab, hidden, layers, heads, inter, DEMO_MAX_TOKENS);
    else
        n = snprintf(buf, cap,
                     "{\n  \"model_type\": \"%s\",\n  \"architectures\": [\"%s\"],\n"
                     "  \"vocab_size\": %zu,\n  \"hidden_size\": %zu,\n  \"num_hidden_layers\": %zu,\n"
                     "  \"num_attention_heads\": %zu,\n  \"intermediate_size\": %zu,\n"
                     "  \"hidden_act\": \"gelu\",\n  \"max_position_embeddings\": %zu,\n"
                     "  \"layer_norm_eps\": 1e-05,\n  \"pad_token_id\": 1,\n"
                     "  \"bos_token_id\": 0,\n  \"eos_token_id\": 2%s",
                     f->model_type, arch, vocab, hidden, layers, heads, inter,
                     DEMO_MAX_TOKENS + f->pos_base,
                     f->rel_bias ? ",\n  \"relative_attention_num_buckets\": 32"
                                 : ",\n  \"type_vocab_size\": 1,\n"
                                   "  \"position_embedding_type\": \"absolute\"");
    if (n_labels) {
        n += snprintf(buf + n, cap - (size_t)n, ",\n  \"id2label\": {");
        for (size_t i = 0; i < n_labels; i++)
            n += snprintf(buf + n, cap - (size_t)n, "%s\"%zu\": \"label_%zu\"", i ? ", " : "",
                          i, i);
        n += snprintf(buf + n, cap - (size_t)n, "}");
    }
    snprintf(buf + n, cap - (size_t)n, "\n}\n");
}

/* The WordPiece vocabulary (vocab.txt): specials (BERT's, or <s> <pad>
 * </s> <unk> <mask> for MPNet), then letters, digits, punctuation, words.
 * *vocab gets the number of ids. */
static int demo_wordpiece_vocab(const struct demo_family *f, const char *dir, size_t *vocab,
                                char *errstr, size_t errstr_size)
{
    char path[4200];
    size_t cap = 1 << 16, len = 0;
    *vocab = 0;
    char *v = malloc(cap);
    if (!v) {
        snprintf(errstr, errstr_size, "%s demo: out of memory", f->kind);
        return -1;
    }
#define ADD(tok)                                                                         \
    do {                                                                                 \
        len += (size_t)snprintf(v + len, cap - len, "%s\n", (tok));                      \
        (*vocab)++;                                                                      \
    } while (0)
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    /* RoBERTa's and MPNet's order: the padding id is 1, as their
     * positions assume. */
    static const char *const bos_specials[] = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"};
    for (size_t i = 0; i < 5; i++) ADD(f->bos_specials ? bos_specials[i] : specials[i]);
    char one[8];
    for (int c = 33; c < 127; c++) {
        if (c >= 'A' && c <= 'Z') continue; /* uncased */
        snprintf(one, sizeof(one), "%c", c);
        ADD(one);
    }
    for (char c = 'a'; c <= 'z'; c++) {
        snprintf(one, sizeof(one), "##%c", c);
        ADD(one);
    }
    for (size_t i = 0; i < sizeof(demo_words) / sizeof(demo_words[0]); i++) {
        /* A word listed twice would make the vocabulary invalid. */
        int dup = 0;
        for (size_t k = 0; k < i; k++) dup |= !strcmp(demo_words[k], demo_words[i]);
        if (!dup && strlen(demo_words[i]) > 1 && strncmp(demo_words[i], "##", 2) != 0) ADD(demo_words[i]);
        else if (!dup && !strncmp(demo_words[i], "##", 2) && strlen(demo_words[i]) > 3) ADD(demo_words[i]);
    }
#undef ADD
    int rc = demo_path_in(path, sizeof(path), dir, "vocab.txt") < 0 ||
                     demo_write_text(path, v, errstr, errstr_size) < 0
                 ? -1
                 : 0;
    if (rc && !path[0]) snprintf(errstr, errstr_size, "%s: path too long", dir);
    free(v);
    return rc;
}

int model_write_demo_bert(const char *dir, size_t layers, size_t hidden, size_t heads,
                          size_t intermediate, size_t n_labels, uint64_t seed, char *errstr,
                          size_t errstr_size)
{
    return model_write_demo_encoder(dir, "bert", layers, hidden, heads, intermediate, n_labels,
                                    seed, errstr, errstr_size);
}

int model_write_demo_encoder(const char *dir, const char *kind, size_t layers, size_t hidden,
                             size_t heads, size_t intermediate, size_t n_labels, uint64_t seed,
                             char *errstr, size_t errstr_size)
{
    const struct demo_family *f = NULL;
    for (size_t i = 0; i < sizeof(demo_families) / sizeof(demo_families[0]); i++)
        if (kind && !strcmp(kind, demo_families[i].kind)) f = &demo_families[i];
    if (!f) {
        snprintf(errstr, errstr_size, "--kind %s is not mlp nor an encoder (%s)",
                 kind ? kind : "(none)", model_demo_encoder_kinds());
        return -1;
    }
    if (n_labels && !f->classifier) {
        snprintf(errstr, errstr_size, "%s demo: an embedder only (no --labels)", f->kind);
        return -1;
    }
    if (!layers || !hidden || !heads || hidden % heads || !intermediate || layers > 64 ||
        hidden > 4096 || intermediate > 16384 || n_labels > 64) {
        snprintf(errstr, errstr_size, "%s demo: bad sizes (layers %zu, hidden %zu, heads %zu, "
                 "intermediate %zu, labels %zu)", f->kind, layers, hidden, heads, intermediate,
                 n_labels);
        return -1;
    }
    char path[4200];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(errstr, errstr_size, "%s: %s", dir, strerror(errno));
        return -1;
    }
    /* The tokenizer: RoBERTa's a byte-level BPE tokenizer.json, XLM-R's
     * a Unigram one, the others a WordPiece vocab.txt. */
    size_t vocab = 0;
    static const char *const roberta_specials[] = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"};
    int trc = !strcmp(f->kind, "roberta")
                  ? demo_bpe_write(dir, roberta_specials, 5,
                                   json_pack("{s:s, s:[s, i], s:[s, i], s:b, s:b}", "type",
                                             "RobertaProcessing", "sep", "</s>", 2, "cls", "<s>",
                                             0, "trim_offsets", 1, "add_prefix_space", 0),
                                   &vocab, errstr, errstr_size)
              : !strcmp(f->kind, "xlm-roberta") ? demo_unigram_tokenizer(dir, &vocab, errstr,
                                                                         errstr_size)
                                                : demo_wordpiece_vocab(f, dir, &vocab, errstr,
                                                                       errstr_size);
    if (trc < 0) return -1;

    char buf[2048];
    demo_config(f, buf, sizeof(buf), vocab, layers, hidden, heads, intermediate, n_labels);
    const char *tok_cfg =
        f->bos_specials
            ? "{\"do_lower_case\": true, \"model_max_length\": 128, \"bos_token\": \"<s>\", "
              "\"cls_token\": \"<s>\", \"sep_token\": \"</s>\", \"eos_token\": \"</s>\", "
              "\"unk_token\": \"<unk>\", \"pad_token\": \"<pad>\", \"mask_token\": \"<mask>\"}\n"
            : "{\"do_lower_case\": true, \"model_max_length\": 128}\n";
    if (demo_path_in(path, sizeof(path), dir, "config.json") < 0 ||
        demo_write_text(path, buf, errstr, errstr_size) < 0 ||
        demo_path_in(path, sizeof(path), dir, "tokenizer_config.json") < 0 ||
        demo_write_text(path, tok_cfg, errstr, errstr_size) < 0)
        goto fail;
    if (!n_labels) {
        char sub[4200];
        if (demo_path_in(path, sizeof(path), dir, "modules.json") < 0 ||
            demo_write_text(path,
                       "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
                       "\"sentence_transformers.models.Transformer\"},\n"
                       " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": "
                       "\"sentence_transformers.models.Pooling\"},\n"
                       " {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": "
                       "\"sentence_transformers.models.Normalize\"}]\n",
                       errstr, errstr_size) < 0)
            goto fail;
        if (demo_path_in(sub, sizeof(sub), dir, "1_Pooling") < 0 || (mkdir(sub, 0755) && errno != EEXIST) ||
            demo_path_in(path, sizeof(path), sub, "config.json") < 0) {
            snprintf(errstr, errstr_size, "%s/1_Pooling: %s", dir, strerror(errno));
            goto fail;
        }
        snprintf(buf, sizeof(buf), "{\"word_embedding_dimension\": %zu, \"pooling_mode_cls_token\": "
                 "false, \"pooling_mode_mean_tokens\": true, \"pooling_mode_max_tokens\": false}\n",
                 hidden);
        if (demo_write_text(path, buf, errstr, errstr_size) < 0) goto fail;
        if (demo_path_in(sub, sizeof(sub), dir, "2_Normalize") < 0 || (mkdir(sub, 0755) && errno != EEXIST)) {
            snprintf(errstr, errstr_size, "%s/2_Normalize: %s", dir, strerror(errno));
            goto fail;
        }
    }

    /* The weights, as PyTorch initializes BERT: normal-ish (here uniform
     * with the same spread, 0.02) for matrices and embeddings, ones and
     * zeros for LayerNorm, zeros for biases made small instead so they
     * matter in tests. */
    enum { MAXT = 9 + 16 * 64 + 4 };
    struct st_write_tensor *t = calloc(MAXT, sizeof(*t));
    uint64_t (*shapes)[2] = calloc(MAXT, sizeof(*shapes));
    char (*names)[128] = calloc(MAXT, sizeof(*names));
    float **data = calloc(MAXT, sizeof(float *));
    size_t nt = 0;
    uint64_t s = seed;
    int rc = -1;
    if (!t || !shapes || !names || !data) goto oom2;
    /* A classifier's encoder tensors under the family's prefix. */
    const char *px = n_labels ? f->prefix : "";
#define TENSOR(pfx, nm, d0, d1, kind)                                                    \
    do {                                                                                 \
        snprintf(names[nt], sizeof(names[nt]), "%s%s", (pfx), (nm));                     \
        size_t cnt = (size_t)(d0) * ((d1) ? (size_t)(d1) : 1);                           \
        if (!(data[nt] = malloc(cnt * sizeof(float)))) goto oom2;                        \
        for (size_t q = 0; q < cnt; q++)                                                 \
            data[nt][q] = (kind) == 0   ? demo_uniform(&s, 0.0346f)                        \
                          : (kind) == 1 ? 1.0f + demo_uniform(&s, 0.1f)                    \
                                        : demo_uniform(&s, 0.05f);                         \
        shapes[nt][0] = (d0);                                                            \
        shapes[nt][1] = (d1);                                                            \
        t[nt] = (struct st_write_tensor){names[nt], ST_F32, (d1) ? 2 : 1, shapes[nt], data[nt]}; \
        nt++;                                                                            \
    } while (0)
    char nm[112];
    if (!strcmp(f->kind, "nomic-bert")) {
        /* NomicBertModel's names; no biases, as nomic-embed has none. */
        static const char *const mods[] = {"attn.Wqkv", "attn.out_proj", "mlp.fc11",
                                           "mlp.fc12", "mlp.fc2"};
        TENSOR("", "embeddings.word_embeddings.weight", vocab, hidden, 0);
        TENSOR("", "embeddings.token_type_embeddings.weight", 2, hidden, 0);
        TENSOR("", "emb_ln.weight", hidden, 0, 1);
        TENSOR("", "emb_ln.bias", hidden, 0, 2);
        for (size_t l = 0; l < layers; l++) {
            for (int k = 0; k < 5; k++) {
                size_t d0 = k == 0 ? 3 * hidden : k < 2 || k == 4 ? hidden : intermediate;
                size_t d1 = k == 4 ? intermediate : hidden;
                snprintf(nm, sizeof(nm), "%s%zu.%s.weight", f->layer, l, mods[k]);
                TENSOR("", nm, d0, d1, 0);
            }
            for (int k = 1; k <= 2; k++) {
                snprintf(nm, sizeof(nm), "%s%zu.norm%d.weight", f->layer, l, k);
                TENSOR("", nm, hidden, 0, 1);
                snprintf(nm, sizeof(nm), "%s%zu.norm%d.bias", f->layer, l, k);
                TENSOR("", nm, hidden, 0, 2);
            }
        }
        goto write;
    }
    TENSOR(px, "embeddings.word_embeddings.weight", vocab, hidden, 0);
    TENSOR(px, "embeddings.position_embeddings.weight", DEMO_MAX_TOKENS + f->pos_base, hidden, 0);
    if (f->type_vocab)
        TENSOR(px, "embeddings.token_type_embeddings.weight", f->type_vocab, hidden, 0);
    TENSOR(px, "embeddings.LayerNorm.weight", hidden, 0, 1);
    TENSOR(px, "embeddings.LayerNorm.bias", hidden, 0, 2);
    for (size_t l = 0; l < layers; l++) {
        for (int k = 0; k < 8; k++) {
            int ln = k == 4 || k == 7;
            size_t d0 = k == 5 ? intermediate : hidden;
            size_t d1 = ln ? 0 : k == 6 ? intermediate : hidden;
            snprintf(nm, sizeof(nm), "%s%zu.%s.weight", f->layer, l, f->mod[k]);
            TENSOR(px, nm, d0, d1, ln ? 1 : 0);
            snprintf(nm, sizeof(nm), "%s%zu.%s.bias", f->layer, l, f->mod[k]);
            TENSOR(px, nm, d0, 0, 2);
        }
    }
    if (f->rel_bias) /* spread like the scores, so the bias shows */
        TENSOR(px, "encoder.relative_attention_bias.weight", 32, heads, 2);
    if (n_labels) {
        snprintf(nm, sizeof(nm), "%s.weight", f->cls_pre);
        TENSOR("", nm, hidden, hidden, 0);
        snprintf(nm, sizeof(nm), "%s.bias", f->cls_pre);
        TENSOR("", nm, hidden, 0, 2);
        snprintf(nm, sizeof(nm), "%s.weight", f->cls_out);
        TENSOR("", nm, n_labels, hidden, 0);
        snprintf(nm, sizeof(nm), "%s.bias", f->cls_out);
        TENSOR("", nm, n_labels, 0, 2);
    }
#undef TENSOR
write:
    if (demo_path_in(path, sizeof(path), dir, "model.safetensors") < 0) goto oom2;
    rc = st_write(path, t, nt, errstr, errstr_size);
    goto done;
oom2:
    snprintf(errstr, errstr_size, "%s demo: out of memory", f->kind);
done:
    for (size_t i = 0; data && i < nt; i++) free(data[i]);
    free(data);
    free(names);
    free(shapes);
    free(t);
    return rc;
fail:
    return -1;
}
