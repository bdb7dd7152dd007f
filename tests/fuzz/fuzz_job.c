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
    struct job *j = job_new();
    if (!j) return 0;
    enum codec_rc rc = codec_decode_job(data, size, key, key ? strlen(key) : 0, ct,
                                        1700000000000, &lim, j, err, sizeof(err));
    if (rc == CODEC_JOB) {
        if (j->err == PROTO_OK) {
            /* Echo the input as a one-row output: exercises the tensor path. */
            j->output = malloc(j->n_input * sizeof(float));
            if (j->output) {
                memcpy(j->output, j->input, j->n_input * sizeof(float));
                j->out_rows = 1;
                j->out_width = j->n_input;
            }
        }
        if (codec_encode_result(j, 1700000000100) != 0) abort();
    }
    mpscan_check(data, size, 8, err, sizeof(err));
    job_free(j);
    return 0;
}
