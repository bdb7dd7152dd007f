/* seeds.c - writes the fuzz target's seed corpus into a directory: valid
 * jobs in every encoding the protocol allows (MessagePack bin and number
 * array, JSON; with model, deadline, timeout, priority and meta; encoder
 * jobs with text, text_pair, tokens, type_ids and truncate) and the
 * hostile inputs of docs/reliability.md (huge declared counts, deep nesting,
 * oversize ids, NaN/Inf, truncation, 0xc1; for encoder jobs, fields that
 * exclude each other, bad shapes and ids, text that is not UTF-8). Run by
 * `make fuzz`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../codecs/wire.h"

static void put(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static void put_job(const char *dir, const char *name, const struct wire_job *j, enum proto_enc e)
{
    unsigned char *b;
    size_t n;
    if (wire_encode_job(j, e, &b, &n) < 0) exit(1);
    put(dir, name, b, n);
    free(b);
}

/* Writes a job in both encodings, as NAME.mp and NAME.json. */
static void put_both(const char *dir, const char *name, const struct wire_job *j)
{
    char n[256];
    snprintf(n, sizeof(n), "%s.mp", name);
    put_job(dir, n, j, PROTO_ENC_MSGPACK);
    snprintf(n, sizeof(n), "%s.json", name);
    put_job(dir, n, j, PROTO_ENC_JSON);
}

/* Encoder jobs (docs/protocol.md v1.1): text as a string and as an array,
 * with pairs, NUL and every UTF-8 width; token ids flat and nested, with
 * type ids; truncate both ways. Then hostile ones: fields that exclude
 * each other, wrong types, shapes that disagree, ids out of range, text
 * that is not UTF-8, huge declared counts inside text and tokens, deep
 * nesting where ids belong. */
static void put_encoder_seeds(const char *dir)
{
    const char *one[] = {"Hello, world!"};
    struct wire_job t = {.id = "seed-text", .timeout_ms = -1, .priority = -1, .text = one,
                         .n_text = 1};
    put_both(dir, "text", &t);
    t.text_as_array = 1;
    t.truncate = WIRE_TRUNCATE_FALSE;
    put_both(dir, "text_array1", &t);

    const char *rows[] = {"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", "", "a\0b"};
    const size_t lens[] = {strlen(rows[0]), 0, 3};
    const char *pairs[] = {"second", "\xc3\xa9", "x"};
    struct wire_job tp = {.id = "seed-pair", .model = "bert", .timeout_ms = 1000,
                          .priority = 3, .text = rows, .text_len = lens, .n_text = 3,
                          .text_pair = pairs, .truncate = WIRE_TRUNCATE_TRUE,
                          .meta_json = "{\"k\":[1,\"v\"]}"};
    put_both(dir, "text_pair", &tp);

    const int32_t ids[] = {101, 7592, 2088, 102, 101, 2023, 102, 0, 2147483647};
    const int32_t types[] = {0, 0, 0, 0, 0, 1, 1, 1, 1};
    const size_t flat[] = {0, 4};
    struct wire_job k = {.id = "seed-tok", .timeout_ms = -1, .priority = -1, .tokens = ids,
                         .token_off = flat, .n_token_rows = 1};
    put_both(dir, "tokens", &k);
    const size_t nested[] = {0, 4, 7, 9};
    k.token_off = nested;
    k.n_token_rows = 3;
    k.type_ids = types;
    k.truncate = WIRE_TRUNCATE_FALSE;
    put_both(dir, "tokens_nested", &k);

    /* hostile, as JSON text (the fuzzer finds the MessagePack forms from
     * the valid ones) */
    static const char *const bad_json[] = {
        "{\"id\":\"h\",\"input\":[1],\"text\":\"x\",\"tokens\":[1]}",
        "{\"id\":\"h\",\"text_pair\":\"x\",\"tokens\":[1],\"type_ids\":[0]}",
        "{\"id\":\"h\",\"text\":[\"a\",\"b\"],\"text_pair\":[\"x\"]}",
        "{\"id\":\"h\",\"text\":[\"a\",7,null,[\"b\"]]}",
        "{\"id\":\"h\",\"text\":[],\"truncate\":\"no\"}",
        "{\"id\":\"h\",\"text\":\"a\\u0000b\",\"model\":\"m\\u0000\"}",
        "{\"id\":\"h\\u0000\",\"text\":\"\\u0000\"}",
        "{\"id\":\"h\",\"tokens\":[-1,1.5,4294967296,9223372036854775807]}",
        "{\"id\":\"h\",\"tokens\":[[1,2],[],3]}",
        "{\"id\":\"h\",\"tokens\":[[1,2],[3]],\"type_ids\":[[0],[0,1]]}",
        "{\"id\":\"h\",\"tokens\":[[1,2],[3,4]],\"type_ids\":[0,0,0,0]}",
        "{\"id\":\"h\",\"tokens\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}",
    };
    for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
        char n[64];
        snprintf(n, sizeof(n), "hostile_enc_%zu.json", i);
        put(dir, n, bad_json[i], strlen(bad_json[i]));
    }
    /* MessagePack only: text that is not UTF-8; a text array and a token
     * row declaring 2^32-1 elements; type_ids as an array16 chain */
    static const unsigned char bad_utf8[] = {0x82, 0xa2, 'i', 'd', 0xa1, 'h', 0xa4, 't', 'e',
                                             'x', 't', 0x92, 0xa2, 0xff, 0xfe, 0xa3, 0xe6,
                                             0x97, 0x80};
    put(dir, "hostile_enc_utf8.mp", bad_utf8, sizeof(bad_utf8));
    static const unsigned char huge_text[] = {0x82, 0xa2, 'i', 'd', 0xa1, 'h', 0xa4, 't',
                                              'e', 'x', 't', 0xdd, 0xff, 0xff, 0xff, 0xff};
    put(dir, "hostile_enc_text_count.mp", huge_text, sizeof(huge_text));
    static const unsigned char huge_row[] = {0x82, 0xa2, 'i', 'd', 0xa1, 'h', 0xa6, 't', 'o',
                                             'k', 'e', 'n', 's', 0x91, 0xdd, 0xff, 0xff, 0xff,
                                             0xff, 0x01};
    put(dir, "hostile_enc_row_count.mp", huge_row, sizeof(huge_row));
    unsigned char chain[24 + 3 * 32];
    size_t n = 0;
    memcpy(chain + n, "\x83\xa2id\xa1h", 6);
    n += 6;
    memcpy(chain + n, "\xa6tokens\x91\x01", 9);
    n += 9;
    memcpy(chain + n, "\xa8type_ids", 9);
    n += 9;
    for (int i = 0; i < 32; i++, n += 3) memcpy(chain + n, "\xdc\xff\xff", 3);
    put(dir, "hostile_enc_types_chain.mp", chain, n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: seeds DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    float in[16];
    for (int i = 0; i < 16; i++) in[i] = (float)i / 7.0f - 1.0f;
    struct wire_job j = {.id = "seed-1", .input = in, .n_input = 16, .timeout_ms = -1,
                         .priority = -1};
    put_job(dir, "mp_bin", &j, PROTO_ENC_MSGPACK);
    put_job(dir, "json", &j, PROTO_ENC_JSON);
    j.input_as_array = 1;
    put_job(dir, "mp_array", &j, PROTO_ENC_MSGPACK);
    j.input_as_array = 0;
    j.model = "demo";
    j.deadline_ms = 1700000005000;
    j.timeout_ms = 250;
    j.priority = 7;
    j.meta_json = "{\"user\":7,\"tags\":[\"a\",true,null,1.5],\"n\":{\"x\":{}}}";
    put_job(dir, "mp_full", &j, PROTO_ENC_MSGPACK);
    put_job(dir, "json_full", &j, PROTO_ENC_JSON);
    in[3] = NAN;
    put_job(dir, "mp_nan", &j, PROTO_ENC_MSGPACK);
    in[3] = INFINITY;
    put_job(dir, "mp_inf", &j, PROTO_ENC_MSGPACK);

    put_encoder_seeds(dir);
    static const char *const gen_json[] = {
        "{\"id\":\"g1\",\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0.7,"
        "\"top_k\":40,\"top_p\":0.9,\"min_p\":0.05,\"seed\":42,\"stop\":[\"\\n\",\"END\"],"
        "\"logprobs\":true,\"stream\":true}",
        "{\"id\":\"g2\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"caf\u00e9?\"}],\"stop\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof(gen_json) / sizeof(gen_json[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "gen_%zu", i);
        put(dir, name, gen_json[i], strlen(gen_json[i]));
    }

    static const unsigned char map32[] = {0xdf, 0x10, 0x00, 0x00, 0x00};
    put(dir, "hostile_map32", map32, sizeof(map32));
    unsigned char chain[96];
    for (int i = 0; i < 32; i++) memcpy(chain + 3 * i, "\xdc\xff\xff", 3);
    put(dir, "hostile_array16_chain", chain, sizeof(chain));
    unsigned char deep[64];
    deep[0] = 0x81;
    deep[1] = 0xa4;
    memcpy(deep + 2, "meta", 4);
    for (int i = 6; i < 46; i++) deep[i] = 0x91;
    deep[46] = 0xc0;
    put(dir, "hostile_deep", deep, 47);
    char big[10300];
    int n = snprintf(big, sizeof(big), "{\"id\":\"");
    memset(big + n, 'a', 10000);
    n += 10000;
    n += snprintf(big + n, sizeof(big) - (size_t)n, "\",\"input\":[1,2]}");
    put(dir, "hostile_long_id", big, (size_t)n);
    static const unsigned char c1[] = {0x81, 0xc1, 0x00};
    put(dir, "hostile_c1", c1, sizeof(c1));
    static const char trunc[] = "{\"id\":\"t\",\"input\":[1,2";
    put(dir, "hostile_truncated", trunc, sizeof(trunc) - 1);
    return 0;
}
