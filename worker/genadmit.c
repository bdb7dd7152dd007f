/* genadmit.c - genadmit.h: a generation job's prompt, bounds and weight.
 *
 * Threads and ownership: as genadmit.h says. */
#include "genadmit.h"

#include <stdlib.h>
#include <string.h>

int genadmit(const struct genmodel *gm, struct tokenizer_scratch **scratch,
             const struct kcfg *cfg, size_t max_record_bytes, struct job *j)
{
    const struct codec_gen *q = j->req.gen;
    if (gm && !q) {
        job_fail(j, PROTO_ERR_INVALID_INPUT, "model %s generates text: send `prompt` or "
                 "`messages` (not input, text or tokens)", j->model_name);
        return -1;
    }
    if (!gm) {
        job_fail(j, PROTO_ERR_INVALID_INPUT, "model %s is not a text-generating model (an "
                 "encoder or an MLP): `prompt` and `messages` are for generation models",
                 j->model_name);
        return -1;
    }
    if (!*scratch && !(*scratch = tokenizer_scratch_new(4096))) {
        job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
        return -2;
    }
    size_t ctx = decoder_info(gm->dec)->context;
    size_t cap = ctx > 1 ? ctx - 1 : 0; /* room for one generated token */
    char why[512];
    int rc;
    if (q->prompt) {
        rc = genmodel_encode_prompt(gm, *scratch, q->prompt, q->prompt_len, cap, &j->ids,
                                    &j->n_tokens, why, sizeof(why));
    } else {
        struct genmodel_msg *m = malloc(q->n_msgs * sizeof(*m));
        if (!m) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
            return -2;
        }
        for (size_t i = 0; i < q->n_msgs; i++)
            m[i] = (struct genmodel_msg){codec_role_name((enum codec_role)q->roles[i]),
                                         q->content + q->content_off[i],
                                         q->content_off[i + 1] - q->content_off[i]};
        rc = genmodel_encode_messages(gm, *scratch, m, q->n_msgs, cap, &j->ids, &j->n_tokens,
                                      why, sizeof(why));
        free(m);
    }
    if (rc == -2) {
        job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory tokenizing the prompt");
        return -2;
    }
    if (rc < 0 && strncmp(why, "the prompt is over", 18) == 0) {
        job_fail(j, PROTO_ERR_INVALID_INPUT, "%s (the model's context is %zu tokens, with "
                 "at least one to generate)", why, ctx);
        return -1;
    }
    if (rc < 0) {
        job_fail(j, PROTO_ERR_INVALID_INPUT, "%s", why);
        return -1;
    }
    size_t max = q->max_tokens ? q->max_tokens : (size_t)cfg->generation.max_tokens;
    if (max > ctx - j->n_tokens) max = ctx - j->n_tokens;
    j->gen_max_tokens = max;
    j->seq_len = 0;
    struct codec_result_size rs = {
        .enc = j->req.enc, .id_len = strlen(j->req.id), .model_len = strlen(j->model_name),
        .topic_len = strlen(j->topic), .meta_len = j->req.meta_len, .gen_tokens = max,
        .gen_token_bytes = gm->longest_token, .gen_logprobs = q->logprobs};
    size_t need = codec_result_max_bytes(&rs);
    if (need > max_record_bytes) {
        job_fail(j, PROTO_ERR_INVALID_INPUT, "the result could take %zu bytes (max_tokens %zu), "
                 "over the producer's message.max.bytes (%zu usable): ask for fewer tokens",
                 need, max, max_record_bytes);
        return -1;
    }
    j->weight = j->n_tokens + max;
    return 0;
}
