/* ug_decode.c - the Unigram tokenizer's decoding (unigram.h): ids back to
 * pieces, then the folder's decoder steps (Metaspace, ByteFallback, Fuse,
 * Replace, Strip), which tokdec.c runs as Hugging Face's `tokenizers`
 * does; invalid byte runs become U+FFFD, never half a character.
 *
 * Threads: any; a loaded tokenizer is read-only. Ownership: the caller's
 * buffer receives the text; everything else is freed before returning. */
#include <stdlib.h>

#include "tokdec.h"
#include "ug_impl.h"
#include "unicode.h"

/* The reference's decode with skip_special_tokens: the tokens' strings
 * through the decoder steps, then joined (spaces between them when the
 * file has no decoder), written like snprintf. */
int ug_decode(const struct ug_tokenizer *t, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    if ((!ids && n) || (!buf && cap)) return UG_ERR_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids) return UG_ERR_ARG;
    /* the steps as tokdec takes them: Metaspace's and Strip's character
     * as UTF-8 */
    static const int kind[] = {
        [UG_D_METASPACE] = TOKDEC_METASPACE, [UG_D_BYTEFALLBACK] = TOKDEC_BYTEFALLBACK,
        [UG_D_FUSE] = TOKDEC_FUSE,           [UG_D_REPLACE] = TOKDEC_REPLACE,
        [UG_D_STRIP] = TOKDEC_STRIP,
    };
    struct tokdec_step st[UG_MAX_STEPS];
    char chr[UG_MAX_STEPS][4];
    for (size_t k = 0; k < t->n_dec; k++) {
        const struct ug_step *u = &t->dec[k];
        st[k] = (struct tokdec_step){.kind = kind[u->kind], .left = u->left, .right = u->right};
        if (u->kind == UG_D_REPLACE) {
            st[k].from = u->from;
            st[k].from_len = u->from_len;
            st[k].to = u->to;
            st[k].to_len = u->to_len;
        } else if (u->kind == UG_D_METASPACE || u->kind == UG_D_STRIP) {
            st[k].from = chr[k];
            st[k].from_len = uni_utf8_encode(u->cp, chr[k]);
            st[k].drop_first = u->kind == UG_D_METASPACE && u->prepend != UG_PREPEND_NEVER;
        }
    }
    const char **tok = malloc((n ? n : 1) * sizeof(*tok));
    size_t *len = malloc((n ? n : 1) * sizeof(*len)), m = 0;
    int rc = UG_ERR_NOMEM;
    if (tok && len) {
        for (size_t i = 0; i < n; i++) {
            if (t->special[ids[i]]) continue;
            tok[m] = t->pool + t->tok_off[ids[i]];
            len[m++] = t->tok_len[ids[i]];
        }
        rc = tokdec_run(st, t->n_dec, tok, len, m, !t->has_decoder, buf, cap);
    }
    free(tok);
    free(len);
    return rc;
}
