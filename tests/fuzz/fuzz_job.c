/* fuzz_job.c - libFuzzer target for everything kinfer does with an
 * untrusted record value: the MessagePack pre-scan, decoding a job (with
 * and without a record key and a content-type header, chosen from the
 * input's own bytes), and encoding the result of whatever decoded, so a
 * job the decoder accepts can always be answered (an encoder's text or
 * token job with per-token output, or scores and labels, as its last
 * byte picks; a generation job answered with its own prompt as the text,
 * within the size bound admission checks). Built by `make fuzz` with -fsanitize=fuzzer,address,undefined;
 * any crash, leak, sanitizer report or failed encode is a finding. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../codecs/codec.h"
#include "../../codecs/mpscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The worker's own limits with its defaults: 1 MiB payloads, depth
     * 32, 1024 rows a job, 65536 characters a row, max_batch_tokens
     * (16384) plus 1024 rows of a 512-token model's ids (worker/intake.c).
     * Left at 0, the rows limits would refuse every text or token job
     * before its rows were read. */
    static const struct codec_limits lim = {.max_payload_bytes = 1 << 20,
                                            .max_input_floats = 1 << 16, .max_depth = 32,
                                            .max_rows = 1024, .max_text_chars = 65536,
                                            .max_tokens = 16384 + 1024 * 512};
    char err[256];
    int flags = size ? data[size - 1] : 0;
    const char *key = (flags & 1) ? "fuzz-key" : NULL;
    const char *ct = (flags & 6) == 2 ? "application/json"
                   : (flags & 6) == 4 ? "application/msgpack" : NULL;
    struct codec_request req = {.priority = -1};
    enum codec_rc rc = codec_decode_job(data, size, key, key ? strlen(key) : 0, ct,
                                        1700000000000, &lim, &req, err, sizeof(err));
    if (rc == CODEC_JOB) {
        /* Echo the input as a one-row output: exercises the tensor path. */
        struct codec_result r = {.id = req.id, .model = req.model, .enc = req.enc,
                                 .err = req.err, .errmsg = req.errmsg, .meta = req.meta,
                                 .meta_len = req.meta_len, .total_ms = 100, .topic = "fuzz"};
        size_t rows = req.n_text ? req.n_text : req.n_token_rows;
        float *out = NULL;
        size_t *lengths = NULL, gen_bound = 0;
        const char **labels = NULL;
        struct codec_gen_result gen;
        if (req.err == PROTO_OK && rows) {
            /* An encoder's job: answer it as the worker would, with each
             * row's length (bytes or ids, capped) as per-token output
             * (flags bit 3) or a classifier's scores and labels (bit 4). */
            const size_t *off = req.n_text ? req.text_off : req.token_off;
            size_t longest = 0;
            lengths = calloc(rows, sizeof(*lengths));
            labels = calloc(rows, sizeof(*labels));
            if (!lengths || !labels) abort();
            for (size_t i = 0; i < rows; i++) {
                size_t n = off[i + 1] - off[i];
                lengths[i] = n > 64 ? 64 : n;
                if (lengths[i] > longest) longest = lengths[i];
                labels[i] = i % 2 ? "neg" : "caf\xc3\xa9";
            }
            r.out_rows = rows;
            r.out_width = 2;
            if (flags & 8) {
                r.out_tokens = longest ? longest : 1;
                r.lengths = lengths;
            }
            if (flags & 16) r.labels = labels;
            out = calloc(rows * (r.out_tokens ? r.out_tokens : 1) * 2, sizeof(float));
            if (!out) abort();
            r.output = out;
            r.tokens = off[rows];
            r.padded_tokens = rows * longest;
        } else if (req.err == PROTO_OK && req.gen) {
            /* A generation job: its prompt (or messages' contents) back as
             * the text, one id and log-probability a byte, within the
             * admission bound for that many one-byte tokens. */
            const struct codec_gen *g = req.gen;
            size_t tl = g->prompt ? g->prompt_len : g->content_off[g->n_msgs];
            lengths = calloc(tl + 1, sizeof(*lengths));
            out = calloc(tl + 1, sizeof(float));
            if (!lengths || !out) abort();
            int32_t *ids = (int32_t *)lengths;
            for (size_t i = 0; i < tl; i++) {
                ids[i] = (int32_t)i;
                out[i] = -(float)i;
            }
            gen = (struct codec_gen_result){.text = g->prompt ? g->prompt : g->content,
                                            .text_len = tl, .tokens = ids, .n_tokens = tl,
                                            .finish_reason = "length", .prompt_tokens = tl,
                                            .completion_tokens = tl,
                                            .logprobs = g->logprobs ? out : NULL,
                                            .ttft_ms = 1.5, .decode_tokens_per_s = 3};
            r.gen = &gen;
            gen_bound = codec_result_max_bytes(&(struct codec_result_size){
                .enc = req.enc, .id_len = strlen(req.id), .model_len = strlen(req.model),
                .topic_len = 4, .meta_len = req.meta_len, .gen_tokens = tl ? tl : 1,
                .gen_token_bytes = 1, .gen_logprobs = g->logprobs});
        } else if (req.err == PROTO_OK) {
            r.output = req.input;
            r.out_rows = 1;
            r.out_width = req.n_input;
        }
        unsigned char *body = NULL;
        size_t len = 0;
        if (codec_encode_result(&r, &body, &len) != 0) abort();
        if (gen_bound && len > gen_bound) abort(); /* admission's bound must hold */
        free(body);
        free(out);
        free(lengths);
        free(labels);
    }
    mpscan_check(data, size, 8, err, sizeof(err));
    codec_request_fini(&req);
    return 0;
}
