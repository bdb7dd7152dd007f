/* smoke.c - `kinfer smoke`: drives a running worker from outside. Sends
 * jobs with librdkafka (MessagePack, some JSON), polls Redis for every
 * result with pipelined GETs, checks each output against the model run
 * here on the CPU (max |difference| <= 1e-4 * max(1,|expected|)), and
 * prints what a user wants to know: how many, how batched, how fast. A
 * text encoder's jobs are texts (tools/textgen.h), tokenized and encoded
 * here by the same model for the check; it must pool (or classify): per
 * token output is not checked here. A generating model's run is
 * smoke_gen.h's.
 *
 * Threads: main thread. */
#include "smoke.h"

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../codecs/wire.h"
#include "../gen/genmodel.h"
#include "../gpu/model.h"
#include "../text/tokenizer.h"
#include "../kafka/kq.h"
#include "smoke_gen.h"
#include "textgen.h"

struct pending {
    char id[64];
    float *expected;   /* rows x output width */
    int got;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_s(void)
{
    return (double)clock_mono_us() / 1e6;
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    int *failed = opaque;
    if (m->err) {
        fprintf(stderr, "kinfer smoke: produce failed: %s\n", rd_kafka_err2str(m->err));
        (*failed)++;
    }
}

/* Which backend and device the worker runs on, in words, from its
 * /readyz at metrics.listen (the configuration smoke was given): writes
 * "backend=cuda device=..." into buf, or why it cannot tell. */
void smoke_worker_device(const struct kcfg *c, char *buf, size_t cap)
{
    const char *listen = c->metrics.listen ? c->metrics.listen : "";
    const char *colon = strrchr(listen, ':');
    if (!*listen || !colon) {
        snprintf(buf, cap, "unknown (metrics.listen is off)");
        return;
    }
    char host[256], port[16];
    const char *h = listen;
    size_t hl = (size_t)(colon - listen);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h++, hl -= 2;
    snprintf(host, sizeof(host), "%.*s", (int)hl, h);
    snprintf(port, sizeof(port), "%s", colon + 1);
    if (!host[0] || strcmp(host, "0.0.0.0") == 0) snprintf(host, sizeof(host), "127.0.0.1");
    else if (strcmp(host, "::") == 0) snprintf(host, sizeof(host), "::1");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int fd = -1;
    if (getaddrinfo(host, port, &hints, &ai) == 0 && ai) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        struct timeval tv = {2, 0};
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
                        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
                        connect(fd, ai->ai_addr, ai->ai_addrlen) < 0)) {
            close(fd);
            fd = -1;
        }
    }
    if (ai) freeaddrinfo(ai);
    if (fd < 0) {
        snprintf(buf, cap, "unknown (no answer at %s)", listen);
        return;
    }
    static const char req[] = "GET /readyz HTTP/1.0\r\nHost: kinfer\r\n\r\n";
    char resp[8192];
    size_t got = 0;
    if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof(req) - 1)) {
        ssize_t k;
        while (got < sizeof(resp) - 1 && (k = recv(fd, resp + got, sizeof(resp) - 1 - got, 0)) > 0)
            got += (size_t)k;
    }
    close(fd);
    resp[got] = '\0';
    const char *body = strstr(resp, "\r\n\r\n");
    json_t *doc = body ? json_loads(body + 4, 0, NULL) : NULL;
    const char *be = json_string_value(json_object_get(doc, "backend"));
    const char *dev = json_string_value(json_object_get(doc, "device"));
    if (be && dev) snprintf(buf, cap, "backend=%s device=%s", be, dev);
    else snprintf(buf, cap, "unknown (%s/readyz names no device)", listen);
    json_decref(doc);
}

/* The producer smoke sends with: delivery failures counted in *failed,
 * the first input topic's leaders known before it returns. NULL (said on
 * stderr) when it cannot be made or the topic does not answer. */
rd_kafka_t *smoke_producer(const struct kcfg *c, int *failed)
{
    char err[512];
    rd_kafka_t *rk;
    rd_kafka_conf_t *conf = kq_conf_new(c, KQ_PRODUCER, err, sizeof(err));
    if (!conf) {
        fprintf(stderr, "kinfer smoke: %s\n", err);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, failed);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kinfer smoke: %s\n", err);
        return NULL;
    }
    /* Learn the topic's partition leaders before the first job. A job
     * produced while they are unknown waits in librdkafka's unassigned
     * queue, and librdkafka 2.0.2 does not always wake the broker thread
     * when the leaders arrive: every job of the run then went out only
     * with the final flush, and the latency figure (from each record's
     * timestamp) was the run's length, p50 ~530 ms at --rate 100 over 1 s,
     * one run in two. */
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, c->kafka.topics[0], NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t me = rkt ? rd_kafka_metadata(rk, 0, rkt, &md, 10000)
                                 : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (md) rd_kafka_metadata_destroy(md);
    if (rkt) rd_kafka_topic_destroy(rkt);
    if (me) {
        fprintf(stderr, "kinfer smoke: topic %s: %s\n", c->kafka.topics[0], rd_kafka_err2str(me));
        rd_kafka_destroy(rk);
        return NULL;
    }
    return rk;
}

int smoke_run(const struct kcfg *c, const struct smoke_opts *o,
              volatile sig_atomic_t *stop)
{
    int rc = 1, produce_failed = 0;
    char err[512];
    int di = cfg_model_index(c, o->model ? o->model : c->default_model);
    if (di < 0) {
        fprintf(stderr, "kinfer smoke: no model named '%s' in the configuration\n", o->model);
        return 1;
    }
    if (genmodel_is_decoder_folder(c->models[di].path)) return smoke_gen_run(c, di, o, stop);
    /* The reference runs on the CPU, whatever backend the worker uses. */
    struct model_runtime_conf rconf;
    model_runtime_conf_defaults(&rconf);
    rconf.backend = "cpu";
    struct model_runtime *rt = model_runtime_new(&rconf, err, sizeof(err));
    struct model *m = rt ? model_load(rt, &c->models[di], err, sizeof(err)) : NULL;
    if (!m) {
        fprintf(stderr, "kinfer smoke: %s\n", err);
        model_runtime_destroy(rt);
        return 1;
    }
    size_t in_w = model_input_width(m), out_w = model_output_width(m);
    const struct model_encoder_info *enc = model_encoder(m);
    struct textgen tg = {0};
    struct tokenizer_scratch *sc = NULL;
    int32_t *ids = NULL;
    uint32_t *offs = NULL;
    const char **texts = NULL;
    char **owned = NULL;
    struct model_ws *ws = NULL;
    struct pending *p = calloc(o->jobs, sizeof(*p));
    float *in = malloc((o->rows * in_w + 1) * sizeof(float));
    double *lat = calloc(o->jobs, sizeof(double));
    redisContext *rc_ = NULL;
    rd_kafka_t *rk = NULL;
    if (enc) {
        if (enc->head == MODEL_HEAD_EMBEDDING && enc->pooling == MODEL_POOL_NONE) {
            fprintf(stderr, "kinfer smoke: model %s outputs every token's vector; smoke checks "
                    "pooled or classifier encoders\n", model_name(m));
            goto out;
        }
        size_t tok = o->rows * enc->max_tokens;
        ws = model_ws_new_tokens(m, 0, o->rows, tok, err, sizeof(err));
        sc = tokenizer_scratch_new(4096);
        ids = malloc(tok * sizeof(*ids));
        offs = malloc((o->rows + 1) * sizeof(*offs));
        texts = calloc(o->rows, sizeof(*texts));
        owned = calloc(o->rows, sizeof(*owned));
        if (textgen_init(&tg, enc) < 0 || !sc || !ids || !offs || !texts || !owned) goto out;
    } else {
        ws = model_ws_new(m, 0, o->rows, err, sizeof(err));
    }
    if (!ws) fprintf(stderr, "kinfer smoke: %s\n", err);
    if (!ws || !p || !in || !lat) goto out;

    if (!(rk = smoke_producer(c, &produce_failed))) goto out;
    struct timeval tv = {2, 0};
    rc_ = redisConnectWithTimeout(c->redis.host, c->redis.port, tv);
    if (!rc_ || rc_->err) {
        fprintf(stderr, "kinfer smoke: redis %s:%d: %s\n", c->redis.host, c->redis.port,
                rc_ ? rc_->errstr : "out of memory");
        goto out;
    }
    redisSetTimeout(rc_, tv);

    /* Send. Ids are unique per run so old results in Redis never count. */
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    double t0 = now_s();
    for (size_t i = 0; i < o->jobs && !*stop; i++) {
        snprintf(p[i].id, sizeof(p[i].id), "smoke-%u-%zu", seed, i);
        const float *out;
        p[i].expected = malloc(o->rows * out_w * sizeof(float));
        if (!p[i].expected) goto out;
        struct wire_job wj = {.id = p[i].id, .timeout_ms = -1, .priority = -1};
        if (enc) {
            /* Texts, tokenized and encoded here for the expected output. */
            offs[0] = 0;
            for (size_t r = 0; r < o->rows; r++) {
                free(owned[r]);
                if (!(owned[r] = strdup(textgen_text(&tg, (uint64_t)seed * 1000003u + i * o->rows + r))))
                    goto out;
                texts[r] = owned[r];
                int n = tokenizer_encode(enc->tokenizer, sc, texts[r], strlen(texts[r]), NULL,
                                         0, enc->max_tokens, 1, ids + offs[r], NULL,
                                         enc->max_tokens, NULL, err, sizeof(err));
                if (n < 0) {
                    fprintf(stderr, "kinfer smoke: tokenizer: %s\n", err);
                    goto out;
                }
                offs[r + 1] = offs[r] + (uint32_t)n;
            }
            struct model_seqs q = {ids, NULL, offs, o->rows};
            if (model_encode(m, ws, &q, &out) < 0) goto out;
            wj.text = texts;
            wj.n_text = o->rows;
        } else {
            for (size_t k = 0; k < o->rows * in_w; k++)
                in[k] = (float)rand_r(&seed) / (float)RAND_MAX * 2.0f - 1.0f;
            if (model_forward(m, ws, in, o->rows, &out) < 0) goto out;
            wj.input = in;
            wj.n_input = o->rows * in_w;
        }
        memcpy(p[i].expected, out, o->rows * out_w * sizeof(float));
        if (o->model) wj.model = o->model;
        enum proto_enc wire_enc = o->json_every && i % (size_t)o->json_every == 0
                                    ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK;
        unsigned char *body;
        size_t len;
        if (wire_encode_job(&wj, wire_enc, &body, &len) < 0) goto out;
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(c->kafka.topics[0]),
                                      RD_KAFKA_V_KEY(p[i].id, strlen(p[i].id)),
                                      RD_KAFKA_V_VALUE(body, len),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(rk, 10);
        free(body);
        if (e) {
            fprintf(stderr, "kinfer smoke: produce: %s\n", rd_kafka_err2str(e));
            goto out;
        }
        rd_kafka_poll(rk, 0);
        if (o->rate > 0) {
            double due = t0 + (double)(i + 1) / o->rate;
            while (now_s() < due) usleep(200);
        }
    }
    rd_kafka_flush(rk, 10000);
    if (produce_failed) goto out;
    fprintf(stderr, "kinfer smoke: sent %zu jobs to %s in %.2f s; waiting for results in Redis\n",
            o->jobs, c->kafka.topics[0], now_s() - t0);

    /* The worker's number format sets the tolerance: the precision its
     * backend runs (worker.cpu_precision or gpu.precision, from the
     * settings smoke was given, which should be the worker's; "auto"
     * read from the models' weights as the worker reads it). */
    char dev[300], pwhy[512];
    smoke_worker_device(c, dev, sizeof(dev));
    const char *prec = strncmp(dev, "backend=cuda", 12) == 0 ? c->gpu.precision : c->worker.cpu_precision;
    if (prec && strcmp(prec, "auto") == 0)
        prec = model_precision_name(model_weights_precision(c->models, c->n_models, pwhy,
                                                            sizeof(pwhy)));
    double rel = !prec || strcmp(prec, "fp32") == 0 ? 1e-4 : strcmp(prec, "tf32") == 0 ? 1e-2 : 8e-2;

    /* Collect: pipelined GET of every missing id, every 50 ms. */
    size_t got = 0, ok = 0, wrong = 0;
    double batches = 0, deadline = now_s() + o->timeout_s, maxdiff = 0;
    size_t plen = strlen(c->redis.key_prefix);
    while (got < o->jobs && now_s() < deadline && !*stop) {
        size_t asked = 0;
        for (size_t i = 0; i < o->jobs; i++) {
            if (p[i].got) continue;
            char key[512];
            snprintf(key, sizeof(key), "%s%s", c->redis.key_prefix, p[i].id);
            const char *argv[] = {"GET", key};
            size_t lens[] = {3, plen + strlen(p[i].id)};
            redisAppendCommandArgv(rc_, 2, argv, lens);
            asked++;
        }
        for (size_t i = 0; i < o->jobs && asked; i++) {
            if (p[i].got) continue;
            asked--;
            void *v;
            if (redisGetReply(rc_, &v) != REDIS_OK) {
                fprintf(stderr, "kinfer smoke: redis: %s\n", rc_->errstr);
                goto out;
            }
            redisReply *rep = v;
            if (rep->type == REDIS_REPLY_STRING) {
                struct wire_result r;
                if (wire_decode_result(rep->str, rep->len, &r, err, sizeof(err)) == 0) {
                    p[i].got = 1;
                    lat[got++] = r.total_ms;
                    if (r.batch_rows > 0) batches += (double)o->rows / (double)r.batch_rows;
                    int good = r.ok && r.rows == o->rows && r.width == out_w && r.output;
                    for (size_t k = 0; good && k < o->rows * out_w; k++) {
                        double d = fabs((double)r.output[k] - p[i].expected[k]);
                        double tol = rel * fmax(1.0, fabs((double)p[i].expected[k]));
                        if (d > maxdiff) maxdiff = d;
                        if (d > tol) good = 0;
                    }
                    if (good) ok++;
                    else if (wrong++ < 5)
                        fprintf(stderr, "kinfer smoke: wrong result for %s: status=%s %s %s\n",
                                p[i].id, r.ok ? "ok" : "error", r.code, r.message);
                    wire_result_fini(&r);
                }
            }
            freeReplyObject(rep);
        }
        if (got < o->jobs) usleep(50000);
    }
    double secs = now_s() - t0;
    qsort(lat, got, sizeof(double), cmp_double);
    printf("kinfer smoke: jobs=%zu results=%zu ok=%zu wrong=%zu missing=%zu\n", o->jobs,
           got, ok, wrong, o->jobs - got);
    if (got) {
        printf("kinfer smoke: batches=%.0f mean_batch_rows=%.2f latency_ms p50=%.1f "
               "p99=%.1f max=%.1f (record timestamp to result)\n",
               batches, batches > 0 ? (double)(got * o->rows) / batches : 0.0,
               lat[(got - 1) / 2], lat[(size_t)((double)(got - 1) * 0.99)], lat[got - 1]);
        printf("kinfer smoke: max |output - local model| = %.3g (tolerance %g of the larger of 1 "
               "and the value, %s); %.0f jobs/s end to end\n", maxdiff, rel, prec ? prec : "fp32",
               (double)got / secs);
    }
    printf("kinfer smoke: the worker ran them on %s\n", dev);
    rc = (ok == o->jobs) ? 0 : 1;
out:
    if (rk) rd_kafka_destroy(rk);
    if (rc_) redisFree(rc_);
    for (size_t i = 0; p && i < o->jobs; i++) free(p[i].expected);
    free(p);
    free(in);
    free(lat);
    for (size_t r = 0; owned && r < o->rows; r++) free(owned[r]);
    free(owned);
    free(texts);
    free(ids);
    free(offs);
    tokenizer_scratch_destroy(sc);
    textgen_fini(&tg);
    model_ws_destroy(ws);
    model_destroy(m);
    model_runtime_destroy(rt);
    return rc;
}
