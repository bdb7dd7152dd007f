/* fuzz_job.c - libFuzzer target for everything kinfer does with an
 * untrusted record value: the MessagePack pre-scan, decoding a job (with
 * and without a record key and a content-type header, chosen from the
 * input's own bytes), and encoding the result of whatever decoded, so a
 * job the decoder accepts can always be answered. Built by `make fuzz`
 * with -fsanitize=fuzzer,address,undefined; any crash, leak, sanitizer
 * report or failed encode is a finding. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../codecs/codec.h"
#include "../../codecs/mpscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The worker's own limits: 1 MiB payloads, depth 32. */
    static const struct codec_limits lim = {.max_payload_bytes = 1 << 20,
                                            .max_input_floats = 1 << 16, .max_depth = 32};
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
        if (req.err == PROTO_OK) {
            r.output = req.input;
            r.out_rows = 1;
            r.out_width = req.n_input;
        }
        unsigned char *body = NULL;
        size_t len = 0;
        if (codec_encode_result(&r, &body, &len) != 0) abort();
        free(body);
    }
    mpscan_check(data, size, 8, err, sizeof(err));
    codec_request_fini(&req);
    return 0;
}
