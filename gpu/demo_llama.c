/* demo_llama.c - decoder_write_demo (decoder.h): a small random Llama
 * folder as Hugging Face lays one out - config.json (LlamaForCausalLM,
 * grouped-query attention), generation_config.json, model.safetensors
 * (F32, drawn from the seed: the same seed, the same bytes),
 * tokenizer.json and tokenizer_config.json, either byte-level BPE over
 * the demo words with the ChatML specials <|endoftext|> <|im_start|>
 * <|im_end|> as ids 0..2 and a ChatML chat_template (Qwen's kind), or a
 * SentencePiece BPE with byte fallback, <unk> <s> </s> as ids 0..2, <s>
 * put in front of every prompt and an [INST] chat_template (Llama 2's
 * and Mistral's kind).
 * The weights are random: the text it generates is not language. A
 * vocabulary larger than the tokenizer's (decoder_write_demo_ex) has
 * rows no text maps to, as released models pad theirs.
 *
 * Threads: any; nothing is shared. */
#include "decoder.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "demo.h"
#include "safetensors.h"

static const char *const demo_llama_specials[] = {"<|endoftext|>", "<|im_start|>",
                                                  "<|im_end|>"};

/* n floats rounded to bfloat16 in place: the first n 16-bit words of x. */
static void demo_llama_narrow(float *x, size_t n)
{
    uint16_t *h = (uint16_t *)(void *)x;
    for (size_t i = 0; i < n; i++) {
        uint16_t b = st_f32_to_bf16(x[i]);
        memcpy(h + i, &b, sizeof(b));
    }
}

/* The files other than the weights and tokenizer.json; sp: the
 * SentencePiece tokenizer's ids and settings; bf16: the weights' type. */
static int demo_llama_texts(const char *dir, size_t vocab, size_t layers, size_t hidden,
                            size_t heads, size_t kv_heads, size_t inter, int sp, int bf16,
                            char *errstr, size_t errstr_size)
{
    json_int_t bos = sp ? 1 : 0;
    json_t *cfg = json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:n, s:s, s:b, s:b, s:b, "
        "s:I, s:I, s:s}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size",
        (json_int_t)vocab, "hidden_size", (json_int_t)hidden, "num_hidden_layers",
        (json_int_t)layers, "num_attention_heads", (json_int_t)heads, "num_key_value_heads",
        (json_int_t)kv_heads, "intermediate_size", (json_int_t)inter, "max_position_embeddings",
        (json_int_t)512, "rms_norm_eps", 1e-6, "rope_theta", 10000.0, "rope_scaling",
        "hidden_act", "silu", "tie_word_embeddings", 0, "attention_bias", 0, "mlp_bias", 0,
        "bos_token_id", bos, "eos_token_id", (json_int_t)2, "torch_dtype",
        bf16 ? "bfloat16" : "float32");
    json_t *gen = sp ? json_pack("{s:I, s:I, s:b, s:f, s:f, s:I}", "bos_token_id", bos,
                                 "eos_token_id", (json_int_t)2, "do_sample", 1, "temperature",
                                 0.7, "top_p", 0.8, "top_k", (json_int_t)20)
                     : json_pack("{s:I, s:[I, I], s:b, s:f, s:f, s:I}", "bos_token_id", bos,
                                 "eos_token_id", (json_int_t)2, (json_int_t)0, "do_sample", 1,
                                 "temperature", 0.7, "top_p", 0.8, "top_k", (json_int_t)20);
    /* the SentencePiece kind's template leaves <s> to the tokenizer, which
     * puts it in front of every text */
    json_t *tok = sp ? json_pack(
        "{s:s, s:s, s:s, s:n, s:I, s:b, s:b, s:s}", "bos_token", "<s>", "eos_token", "</s>",
        "unk_token", "<unk>", "pad_token", "model_max_length", (json_int_t)512, "add_bos_token",
        1, "add_eos_token", 0, "chat_template",
        "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
        "message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + '</s>' }}"
        "{% endif %}{% endfor %}")
                     : json_pack(
        "{s:s, s:s, s:s, s:n, s:I, s:b, s:s}", "eos_token", "<|im_end|>", "pad_token",
        "<|endoftext|>", "unk_token", "<|endoftext|>", "bos_token", "model_max_length",
        (json_int_t)512, "add_bos_token", 0, "chat_template",
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|im_start|>assistant\\n' }}{% endif %}");
    int rc = -1;
    const struct {
        const char *name;
        json_t *j;
    } files[] = {{"config.json", cfg}, {"generation_config.json", gen},
                 {"tokenizer_config.json", tok}};
    for (size_t i = 0; i < 3; i++)
        if (demo_write_json(dir, files[i].name, files[i].j,
                            JSON_PRESERVE_ORDER | JSON_INDENT(2) | JSON_REAL_PRECISION(9), errstr,
                            errstr_size) < 0)
            goto out;
    rc = 0;
out:
    json_decref(cfg);
    json_decref(gen);
    json_decref(tok);
    return rc;
}

int decoder_write_demo(const char *dir, size_t layers, size_t hidden, size_t heads,
                       size_t kv_heads, size_t inter, uint64_t seed, char *errstr,
                       size_t errstr_size)
{
    return decoder_write_demo_tok(dir, layers, hidden, heads, kv_heads, inter, seed,
                                  DECODER_DEMO_BYTELEVEL, errstr, errstr_size);
}

int decoder_write_demo_tok(const char *dir, size_t layers, size_t hidden, size_t heads,
                           size_t kv_heads, size_t inter, uint64_t seed,
                           enum decoder_demo_tok tok, char *errstr, size_t errstr_size)
{
    struct decoder_demo_conf c = {.layers = layers, .hidden = hidden, .heads = heads,
                                  .kv_heads = kv_heads, .inter = inter, .seed = seed,
                                  .tok = tok};
    return decoder_write_demo_ex(dir, &c, errstr, errstr_size);
}

int decoder_write_demo_ex(const char *dir, const struct decoder_demo_conf *c, char *errstr,
                          size_t errstr_size)
{
    size_t layers = c->layers, hidden = c->hidden, heads = c->heads, kv_heads = c->kv_heads;
    size_t inter = c->inter;
    int bf16 = c->bf16;
    if (!layers || !heads || !kv_heads || !inter || heads % kv_heads || hidden % heads ||
        (hidden / heads) % 2 || layers > 64 || hidden > 4096 || inter > 16384 || c->vocab > (1u << 20)) {
        snprintf(errstr, errstr_size,
                 "llama demo: %zu layers, hidden %zu, %zu heads (%zu key/value), intermediate "
                 "%zu: heads must divide hidden into an even head size, key/value heads "
                 "divide heads", layers, hidden, heads, kv_heads, inter);
        return -1;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(errstr, errstr_size, "%s: %s", dir, strerror(errno));
        return -1;
    }
    size_t vocab = 0;
    int sp = c->tok == DECODER_DEMO_SENTENCEPIECE;
    if ((sp ? demo_sp_write(dir, &vocab, errstr, errstr_size)
            : demo_bpe_write(dir, demo_llama_specials, 3, NULL, &vocab, errstr, errstr_size)) < 0)
        return -1;
    if (c->vocab > vocab) vocab = c->vocab;
    if (demo_llama_texts(dir, vocab, layers, hidden, heads, kv_heads, inter, sp, bf16, errstr,
                         errstr_size) < 0)
        return -1;
    size_t H = hidden, K = kv_heads * (hidden / heads), I = inter;
    /* per layer: 2 norms, q, k, v, o, gate, up, down; then embed, norm, head */
    size_t nt = 9 * layers + 3, k = 0;
    struct st_write_tensor *t = calloc(nt, sizeof(*t));
    uint64_t(*shapes)[2] = calloc(nt, sizeof(*shapes));
    char(*names)[96] = calloc(nt, sizeof(*names));
    float **data = calloc(nt, sizeof(*data));
    int rc = -1;
    if (!t || !shapes || !names || !data) goto oom;
    uint64_t s = c->seed;
    /* name, rows, columns (0: a norm's weight, ones with a little noise) */
#define ADD(nm_fmt, l, d0, d1)                                                             \
    do {                                                                                   \
        snprintf(names[k], sizeof(names[k]), nm_fmt, (size_t)(l));                         \
        size_t n_ = (d0) * ((d1) ? (d1) : 1);                                              \
        if (!(data[k] = malloc(n_ * sizeof(float)))) goto oom;                             \
        float b_ = (d1) ? 1.0f / sqrtf((float)(d1)) : 0.1f;                                \
        for (size_t q_ = 0; q_ < n_; q_++)                                                 \
            data[k][q_] = ((d1) ? 0.0f : 1.0f) + demo_uniform(&s, b_);                     \
        if (bf16) demo_llama_narrow(data[k], n_);                                          \
        shapes[k][0] = (d0);                                                               \
        shapes[k][1] = (d1);                                                               \
        t[k] = (struct st_write_tensor){names[k], bf16 ? ST_BF16 : ST_F32, (d1) ? 2 : 1,   \
                                        shapes[k], data[k]};                               \
        k++;                                                                               \
    } while (0)
    ADD("model.embed_tokens.weight%.0zu", 0, vocab, H);
    for (size_t l = 0; l < layers; l++) {
        ADD("model.layers.%zu.input_layernorm.weight", l, H, 0);
        ADD("model.layers.%zu.self_attn.q_proj.weight", l, H, H);
        ADD("model.layers.%zu.self_attn.k_proj.weight", l, K, H);
        ADD("model.layers.%zu.self_attn.v_proj.weight", l, K, H);
        ADD("model.layers.%zu.self_attn.o_proj.weight", l, H, H);
        ADD("model.layers.%zu.post_attention_layernorm.weight", l, H, 0);
        ADD("model.layers.%zu.mlp.gate_proj.weight", l, I, H);
        ADD("model.layers.%zu.mlp.up_proj.weight", l, I, H);
        ADD("model.layers.%zu.mlp.down_proj.weight", l, H, I);
    }
    ADD("model.norm.weight%.0zu", 0, H, 0);
    ADD("lm_head.weight%.0zu", 0, vocab, H);
#undef ADD
    char path[4200];
    if (demo_path_in(path, sizeof(path), dir, "model.safetensors") < 0) goto oom;
    rc = st_write(path, t, k, errstr, errstr_size);
    goto out;
oom:
    snprintf(errstr, errstr_size, "llama demo: out of memory");
out:
    for (size_t i = 0; data && i < nt; i++) free(data[i]);
    free(data);
    free(names);
    free(shapes);
    free(t);
    return rc;
}
