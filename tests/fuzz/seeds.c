/* seeds.c - writes the fuzz target's seed corpus into a directory: valid
 * jobs in every encoding the protocol allows (MessagePack bin and number
 * array, JSON; with model, deadline, timeout, priority and meta) and the
 * hostile inputs of docs/reliability.md (huge declared counts, deep nesting,
 * oversize ids, NaN/Inf, truncation, 0xc1). Run by `make fuzz`. */
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
