/* bpe_comp.c - tokenizer.json's normalizer, pre-tokenizer and decoder for
 * the BPE loaders (bpe_impl.h), in either flavour: byte-level (ByteLevel,
 * alone or after Split steps; NFC; the ByteLevel decoder) or
 * SentencePiece-style (Metaspace or no pre-tokenizer; NFC, Prepend and
 * Replace; the decoder steps Replace, ByteFallback, Fuse, Strip and
 * Metaspace). Each component is checked to be one bpe.c and bpe_sp.c
 * run, so anything else (a Lowercase normalizer, a Whitespace
 * pre-tokenizer, a Regex Replace, a ByteLevel decoder after Metaspace) is
 * refused at load with a message naming it.
 *
 * Threads: whichever thread calls a loader. Ownership: what is read is
 * owned by the bpe_tok (steps' strings, compiled regexes). */
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"
#include "unicode.h"

/* GPT-2's regex; ByteLevel's use_regex splits with it. */
static const char bpe_gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- regexes ---------------------------------------------------------------------- */

/* Compiles a pattern the reference runs on Oniguruma: \s there is
 * White_Space, which with PCRE2's UCP lacks U+0085, so \s gains it (in a
 * class and out) and \S outside a class becomes [^\s\x{85}]. A \S inside
 * a class is refused (it has no such rewrite). literal: a String pattern.
 * Returns the code, or NULL with errstr filled. */
static pcre2_code *bpe_compile(const char *pat, size_t n, int literal, const char *path,
                               const char *where, char *errstr, size_t errstr_size)
{
    char *out = malloc(n * 12 + 1);
    if (!out) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        return NULL;
    }
    size_t o = 0;
    if (literal) {
        memcpy(out, pat, n);
        o = n;
    } else {
        int in_class = 0;
        for (size_t i = 0; i < n; i++) {
            char c = pat[i];
            if (c == '\\' && i + 1 < n) {
                char d = pat[i + 1];
                if (d == 's') {
                    const char *r = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
                    memcpy(out + o, r, strlen(r));
                    o += strlen(r);
                } else if (d == 'S') {
                    if (in_class) {
                        free(out);
                        bpe_seterr(errstr, errstr_size, "%s: %s: \\S inside a character class "
                                   "is not supported", path, where);
                        return NULL;
                    }
                    memcpy(out + o, "[^\\s\\x{85}]", 11);
                    o += 11;
                } else {
                    out[o++] = c;
                    out[o++] = d;
                }
                i++;
                continue;
            }
            if (c == '[' && !in_class) {
                in_class = 1;
                out[o++] = c;
                /* a ] right after [ or [^ is a literal */
                if (i + 1 < n && pat[i + 1] == '^') out[o++] = pat[++i];
                if (i + 1 < n && pat[i + 1] == ']') out[o++] = pat[++i];
                continue;
            }
            if (c == ']' && in_class) in_class = 0;
            out[o++] = c;
        }
    }
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)out, o,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK |
                                       (literal ? PCRE2_LITERAL : 0),
                                   &err, &eoff, NULL);
    free(out);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        bpe_seterr(errstr, errstr_size, "%s: %s: the pattern does not compile: %s", path, where,
                   (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* an interpreter is the fallback */
    return re;
}

/* ---- shared -------------------------------------------------------------------------- */

int bpe_json_bool(const json_t *o, const char *key, int *out, const char *path, const char *where,
                  char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        bpe_seterr(errstr, errstr_size, "%s: %s.%s is not true or false", path, where, key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

void bpe_steps_free(struct bpe_step *st, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(st[i].from);
        free(st[i].to);
    }
}

/* A copy of the JSON string v (non-empty unless empty_ok) into *dst,
 * *len. 0, or -1 with errstr filled. */
static int bpe_json_str(const json_t *v, int empty_ok, char **dst, size_t *len, const char *path,
                        const char *where, char *errstr, size_t errstr_size)
{
    if (!json_is_string(v) || (!empty_ok && json_string_length(v) == 0) ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        bpe_seterr(errstr, errstr_size, "%s: %s is not a %sstring without NUL", path, where,
                   empty_ok ? "" : "non-empty ");
        return -1;
    }
    *len = json_string_length(v);
    if (!(*dst = malloc(*len + 1))) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    memcpy(*dst, json_string_value(v), *len + 1);
    return 0;
}

/* A JSON string holding exactly one character (Metaspace's replacement,
 * Strip's content) into st->from. */
static int bpe_json_char(const json_t *v, struct bpe_step *st, const char *path,
                         const char *where, char *errstr, size_t errstr_size)
{
    if (bpe_json_str(v, 0, &st->from, &st->from_len, path, where, errstr, errstr_size)) return -1;
    uint32_t cp;
    if (uni_utf8_decode((const unsigned char *)st->from, st->from_len, &cp) != st->from_len) {
        bpe_seterr(errstr, errstr_size, "%s: %s is not one character", path, where);
        return -1;
    }
    return 0;
}

/* A Replace's {"pattern": {"String": s}, "content": c} (a Regex pattern
 * is refused) into st. */
static int bpe_json_replace(const json_t *o, struct bpe_step *st, const char *path,
                            const char *where, char *errstr, size_t errstr_size)
{
    const json_t *pat = json_object_get(o, "pattern");
    if (!json_object_get(pat, "String")) {
        bpe_seterr(errstr, errstr_size, "%s: %s Replace: only a String pattern is supported",
                   path, where);
        return -1;
    }
    return bpe_json_str(json_object_get(pat, "String"), 0, &st->from, &st->from_len, path,
                        where, errstr, errstr_size) ||
                   bpe_json_str(json_object_get(o, "content"), 1, &st->to, &st->to_len, path,
                                where, errstr, errstr_size)
               ? -1
               : 0;
}

/* prepend_scheme ("always", "first", "never"), or the older
 * add_prefix_space (true: always). */
static int bpe_json_prepend(const json_t *o, int *out, const char *path, const char *where,
                            char *errstr, size_t errstr_size)
{
    const char *ps = json_string_value(json_object_get(o, "prepend_scheme"));
    if (ps) {
        if (!strcmp(ps, "always")) *out = BPE_PREPEND_ALWAYS;
        else if (!strcmp(ps, "first")) *out = BPE_PREPEND_FIRST;
        else if (!strcmp(ps, "never")) *out = BPE_PREPEND_NEVER;
        else {
            bpe_seterr(errstr, errstr_size, "%s: %s.prepend_scheme \"%s\" is not always, first "
                       "or never", path, where, ps);
            return -1;
        }
        return 0;
    }
    int aps = 1;
    if (bpe_json_bool(o, "add_prefix_space", &aps, path, where, errstr, errstr_size)) return -1;
    *out = aps ? BPE_PREPEND_ALWAYS : BPE_PREPEND_NEVER;
    return 0;
}

/* ---- normalizer ------------------------------------------------------------------------ */

/* One normalizer (or a Sequence of them): NFC (before any other step),
 * Prepend, Replace with a String pattern. */
static int bpe_json_norm(struct bpe_tok *t, const json_t *n, const char *path, char *errstr,
                         size_t errstr_size)
{
    if (!n || json_is_null(n)) return 0;
    const char *type = bpe_type(n);
    if (type && !strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) goto bad;
        for (size_t i = 0; i < json_array_size(list); i++)
            if (bpe_json_norm(t, json_array_get(list, i), path, errstr, errstr_size)) return -1;
        return 0;
    }
    if (type && !strcmp(type, "NFC") && t->n_nstep == 0) {
        t->nfc = 1;
        return 0;
    }
    if (type && (!strcmp(type, "Prepend") || !strcmp(type, "Replace"))) {
        if (t->n_nstep == BPE_MAX_STEPS) goto bad;
        struct bpe_step *st = &t->nstep[t->n_nstep++];
        if (!strcmp(type, "Prepend")) {
            st->kind = BPE_N_PREPEND;
            return bpe_json_str(json_object_get(n, "prepend"), 0, &st->to, &st->to_len, path,
                                "normalizer Prepend.prepend", errstr, errstr_size);
        }
        st->kind = BPE_N_REPLACE;
        return bpe_json_replace(n, st, path, "normalizer", errstr, errstr_size);
    }
bad:
    bpe_seterr(errstr, errstr_size, "%s: normalizer \"%s\" is not supported (none, NFC first, "
               "Prepend, Replace of a String, at most %d steps)", path, type ? type : "?",
               BPE_MAX_STEPS);
    return -1;
}

/* ---- pre-tokenizer -------------------------------------------------------------------- */

/* One ByteLevel pre-tokenizer object's settings. */
static int bpe_json_bytelevel(struct bpe_tok *t, const json_t *o, const char *path,
                              char *errstr, size_t errstr_size)
{
    int aps = 1, rx = 1;
    if (bpe_json_bool(o, "add_prefix_space", &aps, path, "pre_tokenizer", errstr, errstr_size) ||
        bpe_json_bool(o, "use_regex", &rx, path, "pre_tokenizer", errstr, errstr_size))
        return -1;
    t->add_prefix_space = aps;
    if (rx && !(t->bl_re = bpe_compile(bpe_gpt2_re, strlen(bpe_gpt2_re), 0, path,
                                       "ByteLevel's regex", errstr, errstr_size)))
        return -1;
    return 0;
}

int bpe_bytelevel_gpt2(struct bpe_tok *t, const char *path, char *errstr, size_t errstr_size)
{
    t->bl_re = bpe_compile(bpe_gpt2_re, strlen(bpe_gpt2_re), 0, path, "ByteLevel's regex", errstr,
                           errstr_size);
    return t->bl_re ? 0 : -1;
}

/* A Split step: {"pattern": {"Regex"|"String": ...}, "behavior":
 * "Isolated"|"Removed", "invert": false}. */
static int bpe_json_split(struct bpe_tok *t, const json_t *o, const char *path, char *errstr,
                          size_t errstr_size)
{
    const json_t *pat = json_object_get(o, "pattern");
    const json_t *rx = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    const char *beh = json_string_value(json_object_get(o, "behavior"));
    int invert = 0;
    if (bpe_json_bool(o, "invert", &invert, path, "pre_tokenizer.Split", errstr, errstr_size))
        return -1;
    const json_t *p = rx ? rx : str;
    if (!json_is_string(p) || !beh || (strcmp(beh, "Isolated") && strcmp(beh, "Removed")) ||
        invert || t->n_split == BPE_MAX_SPLITS) {
        bpe_seterr(errstr, errstr_size, "%s: pre_tokenizer Split: only a Regex or String pattern, "
                   "behavior Isolated or Removed, invert false, at most %d steps, are supported "
                   "(behavior \"%s\")", path, BPE_MAX_SPLITS, beh ? beh : "?");
        return -1;
    }
    struct bpe_split *s = &t->split[t->n_split];
    s->removed = !strcmp(beh, "Removed");
    if (!(s->re = bpe_compile(json_string_value(p), json_string_length(p), str != NULL, path,
                              "pre_tokenizer Split's pattern", errstr, errstr_size)))
        return -1;
    t->n_split++;
    return 0;
}

/* Metaspace: replacement (one character), prepend_scheme, split. */
static int bpe_json_metaspace(struct bpe_tok *t, const json_t *o, const char *path, char *errstr,
                              size_t errstr_size)
{
    struct bpe_step tmp = {0};
    int rc = bpe_json_char(json_object_get(o, "replacement"), &tmp, path,
                           "pre_tokenizer Metaspace.replacement", errstr, errstr_size);
    if (!rc && tmp.from_len <= sizeof(t->meta_rep)) {
        memcpy(t->meta_rep, tmp.from, tmp.from_len);
        t->meta_rep_len = tmp.from_len;
    }
    free(tmp.from);
    t->meta_split = 1;
    if (rc || bpe_json_prepend(o, &t->meta_prepend, path, "pre_tokenizer", errstr, errstr_size) ||
        bpe_json_bool(o, "split", &t->meta_split, path, "pre_tokenizer", errstr, errstr_size))
        return -1;
    t->meta = 1;
    return 0;
}

/* pre_tokenizer: ByteLevel, or a Sequence of Split steps ending in
 * ByteLevel (byte-level); Metaspace or none (SentencePiece-style). */
static int bpe_json_pre(struct bpe_tok *t, const json_t *pre, const char *path, char *errstr,
                        size_t errstr_size)
{
    const char *type = bpe_type(pre);
    if (!pre || json_is_null(pre)) {
        t->sp = 1;
        return 0;
    }
    if (type && !strcmp(type, "Metaspace")) {
        t->sp = 1;
        return bpe_json_metaspace(t, pre, path, errstr, errstr_size);
    }
    if (type && !strcmp(type, "ByteLevel")) return bpe_json_bytelevel(t, pre, path, errstr, errstr_size);
    if (type && !strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(pre, "pretokenizers");
        size_t n = json_array_size(list);
        const char *last = n ? bpe_type(json_array_get(list, n - 1)) : NULL;
        if (json_is_array(list) && last && !strcmp(last, "ByteLevel")) {
            for (size_t i = 0; i + 1 < n; i++) {
                const json_t *x = json_array_get(list, i);
                const char *ty = bpe_type(x);
                if (!ty || strcmp(ty, "Split")) {
                    bpe_seterr(errstr, errstr_size, "%s: pre_tokenizer Sequence holds \"%s\"; "
                               "only Split steps then ByteLevel are supported", path,
                               ty ? ty : "?");
                    return -1;
                }
                if (bpe_json_split(t, x, path, errstr, errstr_size)) return -1;
            }
            return bpe_json_bytelevel(t, json_array_get(list, n - 1), path, errstr, errstr_size);
        }
        if (json_is_array(list) && n == 1 && last && !strcmp(last, "Metaspace"))
            return bpe_json_pre(t, json_array_get(list, 0), path, errstr, errstr_size);
    }
    bpe_seterr(errstr, errstr_size, "%s: pre_tokenizer \"%s\" is not supported: BPE needs "
               "ByteLevel (alone or after Split steps), Metaspace, or none", path,
               type ? type : "?");
    return -1;
}

/* ---- decoder --------------------------------------------------------------------------- */

/* One decoder step of the SentencePiece-style flavour. */
static int bpe_json_dstep(struct bpe_tok *t, const json_t *d, const char *type, const char *path,
                          char *errstr, size_t errstr_size)
{
    if (t->n_dstep == BPE_MAX_STEPS) {
        bpe_seterr(errstr, errstr_size, "%s: decoder: more than %d steps", path, BPE_MAX_STEPS);
        return -1;
    }
    struct bpe_step *st = &t->dstep[t->n_dstep++];
    if (!strcmp(type, "ByteFallback")) {
        st->kind = BPE_D_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        st->kind = BPE_D_FUSE;
    } else if (!strcmp(type, "Replace")) {
        st->kind = BPE_D_REPLACE;
        return bpe_json_replace(d, st, path, "decoder", errstr, errstr_size);
    } else if (!strcmp(type, "Strip")) {
        st->kind = BPE_D_STRIP;
        const json_t *a = json_object_get(d, "start"), *b = json_object_get(d, "stop");
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < 0 || json_integer_value(a) > 1024 ||
            json_integer_value(b) > 1024) {
            bpe_seterr(errstr, errstr_size, "%s: decoder Strip: start and stop are not counts",
                       path);
            return -1;
        }
        st->left = (int)json_integer_value(a);
        st->right = (int)json_integer_value(b);
        return bpe_json_char(json_object_get(d, "content"), st, path, "decoder Strip.content",
                             errstr, errstr_size);
    } else if (!strcmp(type, "Metaspace")) {
        st->kind = BPE_D_METASPACE;
        return bpe_json_char(json_object_get(d, "replacement"), st, path,
                             "decoder Metaspace.replacement", errstr, errstr_size) ||
                       bpe_json_prepend(d, &st->prepend, path, "decoder", errstr, errstr_size)
                   ? -1
                   : 0;
    } else {
        t->n_dstep--;
        bpe_seterr(errstr, errstr_size, "%s: decoder \"%s\" is not supported with a "
                   "SentencePiece-style BPE (Replace, ByteFallback, Fuse, Strip, Metaspace)",
                   path, type);
        return -1;
    }
    return 0;
}

/* decoder: ByteLevel (also inside a Sequence of one) or none for the
 * byte-level flavour; steps, alone or in a Sequence, for the other. */
static int bpe_json_dec(struct bpe_tok *t, const json_t *d, const char *path, char *errstr,
                        size_t errstr_size)
{
    if (!d || json_is_null(d)) return 0;
    const char *type = bpe_type(d);
    if (!type) type = "?";
    if (!t->sp && !strcmp(type, "ByteLevel")) {
        t->dec_bytelevel = 1;
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list)) goto bad;
        if (!t->sp && json_array_size(list) != 1) goto bad;
        for (size_t i = 0; i < json_array_size(list); i++) {
            const json_t *x = json_array_get(list, i);
            if (bpe_type(x) && !strcmp(bpe_type(x), "Sequence")) goto bad;
            if (bpe_json_dec(t, x, path, errstr, errstr_size)) return -1;
        }
        return 0;
    }
    if (t->sp) return bpe_json_dstep(t, d, type, path, errstr, errstr_size);
bad:
    bpe_seterr(errstr, errstr_size, "%s: decoder \"%s\" is not supported (%s)", path, type,
               t->sp ? "a Sequence of Replace, ByteFallback, Fuse, Strip, Metaspace"
                     : "ByteLevel or none");
    return -1;
}

int bpe_json_components(struct bpe_tok *t, const json_t *root, const char *path, char *errstr,
                        size_t errstr_size)
{
    if (bpe_json_norm(t, json_object_get(root, "normalizer"), path, errstr, errstr_size) ||
        bpe_json_pre(t, json_object_get(root, "pre_tokenizer"), path, errstr, errstr_size) ||
        bpe_json_dec(t, json_object_get(root, "decoder"), path, errstr, errstr_size))
        return -1;
    if (t->byte_fallback && !t->sp) {
        bpe_seterr(errstr, errstr_size, "%s: model.byte_fallback with a ByteLevel pre-tokenizer "
                   "is not supported", path);
        return -1;
    }
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        char s[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        t->bf_id[b] = t->byte_fallback ? bpe_find_model(t, s, 6) : -1;
    }
    return 0;
}
