/* broker.c - hosts librdkafka's mock cluster in this process until a
 * signal. The mock keeps at most ~5 MB per partition (librdkafka 2.0.2), so
 * tests size their backlogs below that; topics not created here are
 * auto-created on first use with the mock's default partition count.
 *
 * While it runs it serves a control channel: one command per line on
 * stdin (down/up/rtt of a broker, injected request errors, coordinator and
 * leader moves), one answer line on stdout, so a test can break the
 * cluster under a running worker and mend it again. End of input, or a
 * stdin that cannot be read (closed, /dev/null, a terminal this process
 * group does not own), just ends the channel.
 *
 * Threads: main thread; the mock cluster runs its own. */
#include "broker.h"

#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "broker_fwd.h"
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>


#define CTL_LINE_MAX 1024
#define CTL_ERRORS_MAX 10000

/* Kafka protocol request types by name, for the error command. */
static const struct {
    const char *name;
    int16_t key;
} api_keys[] = {
    {"Produce", 0},        {"Fetch", 1},          {"ListOffsets", 2},     {"Metadata", 3},
    {"OffsetCommit", 8},   {"OffsetFetch", 9},    {"FindCoordinator", 10}, {"JoinGroup", 11},
    {"Heartbeat", 12},     {"LeaveGroup", 13},    {"SyncGroup", 14},      {"DescribeGroups", 15},
    {"ListGroups", 16},    {"SaslHandshake", 17}, {"ApiVersions", 18},    {"CreateTopics", 19},
    {"DeleteTopics", 20},  {"InitProducerId", 22}, {"AddPartitionsToTxn", 24},
    {"AddOffsetsToTxn", 25}, {"EndTxn", 26},      {"TxnOffsetCommit", 28},
};

/* A whole decimal number in lo..hi, or -1 with *ok = 0. */
static long ctl_number(const char *s, long lo, long hi, int *ok)
{
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    *ok = s && *s && !*end && v >= lo && v <= hi;
    return *ok ? v : -1;
}

/* An ApiKey given as a number or a name (case-insensitive). */
static int ctl_api_key(const char *s, int16_t *out)
{
    int ok;
    long v = ctl_number(s, 0, 32767, &ok);
    if (ok) {
        *out = (int16_t)v;
        return 0;
    }
    for (size_t i = 0; s && i < sizeof(api_keys) / sizeof(api_keys[0]); i++)
        if (strcasecmp(api_keys[i].name, s) == 0) {
            *out = api_keys[i].key;
            return 0;
        }
    return -1;
}

/* An error code given as a number or librdkafka's name for it, with or
 * without the RD_KAFKA_RESP_ERR_ prefix (NOT_LEADER_FOR_PARTITION, 6). */
static int ctl_err_code(const char *s, rd_kafka_resp_err_t *out)
{
    int ok;
    long v = ctl_number(s, -200, 1000, &ok);
    if (ok) {
        *out = (rd_kafka_resp_err_t)v;
        return 0;
    }
    if (!s) return -1;
    if (strncasecmp(s, "RD_KAFKA_RESP_ERR_", 18) == 0) s += 18;
    const struct rd_kafka_err_desc *d;
    size_t n;
    rd_kafka_get_err_descs(&d, &n);
    for (size_t i = 0; i < n; i++)
        if (d[i].name && strcasecmp(d[i].name, s) == 0) {
            *out = d[i].code;
            return 0;
        }
    return -1;
}

/* Runs one broker-scoped change on one broker or on all of them. */
static rd_kafka_resp_err_t ctl_each_broker(rd_kafka_mock_cluster_t *mc, int n_brokers,
                                           const char *which, int what, int arg,
                                           char *why, size_t cap)
{
    int ok;
    int lo, hi;
    if (which && strcmp(which, "all") == 0) {
        lo = 1;
        hi = n_brokers;
    } else {
        lo = hi = (int)ctl_number(which, 1, n_brokers, &ok);
        if (!ok) {
            snprintf(why, cap, "broker id must be 1..%d or all", n_brokers);
            return RD_KAFKA_RESP_ERR__INVALID_ARG;
        }
    }
    for (int id = lo; id <= hi; id++) {
        rd_kafka_resp_err_t e =
            what == 0   ? rd_kafka_mock_broker_set_down(mc, id)
            : what == 1 ? rd_kafka_mock_broker_set_up(mc, id)
                        : rd_kafka_mock_broker_set_rtt(mc, id, arg);
        if (e) {
            snprintf(why, cap, "broker %d: %s", id, rd_kafka_err2str(e));
            return e;
        }
    }
    return RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Executes one command line and writes its one-line answer. */
static void ctl_command(rd_kafka_mock_cluster_t *mc, int n_brokers, char *line)
{
    char *save = NULL, *tok[6] = {0};
    int nt = 0;
    for (char *t = strtok_r(line, " \t\r", &save); t && nt < 6; t = strtok_r(NULL, " \t\r", &save))
        tok[nt++] = t;
    if (nt == 0) return; /* blank line: no answer */
    char why[256] = "";
    int ok = 1, n_ok;
    const char *cmd = tok[0];
    if (strcmp(cmd, "ping") == 0 && nt == 1) {
    } else if ((strcmp(cmd, "down") == 0 || strcmp(cmd, "up") == 0) && nt == 2) {
        ok = !ctl_each_broker(mc, n_brokers, tok[1], cmd[0] == 'd' ? 0 : 1, 0, why, sizeof(why));
    } else if (strcmp(cmd, "rtt") == 0 && nt == 3) {
        long ms = ctl_number(tok[2], 0, 3600000, &n_ok);
        if (!n_ok) {
            ok = 0;
            snprintf(why, sizeof(why), "rtt: ms must be 0..3600000");
        } else {
            ok = !ctl_each_broker(mc, n_brokers, tok[1], 2, (int)ms, why, sizeof(why));
        }
    } else if (strcmp(cmd, "error") == 0 && nt == 4) {
        int16_t key;
        rd_kafka_resp_err_t code;
        long cnt = ctl_number(tok[2], 1, CTL_ERRORS_MAX, &n_ok);
        if (ctl_api_key(tok[1], &key) < 0) {
            ok = 0;
            snprintf(why, sizeof(why), "unknown ApiKey '%s'", tok[1]);
        } else if (!n_ok) {
            ok = 0;
            snprintf(why, sizeof(why), "count must be 1..%d", CTL_ERRORS_MAX);
        } else if (ctl_err_code(tok[3], &code) < 0) {
            ok = 0;
            snprintf(why, sizeof(why), "unknown error code '%s'", tok[3]);
        } else {
            rd_kafka_resp_err_t *errs = malloc((size_t)cnt * sizeof(*errs));
            if (!errs) {
                ok = 0;
                snprintf(why, sizeof(why), "out of memory");
            } else {
                for (long i = 0; i < cnt; i++) errs[i] = code;
                rd_kafka_mock_push_request_errors_array(mc, key, (size_t)cnt, errs);
                free(errs);
            }
        }
    } else if (strcmp(cmd, "clear") == 0 && nt == 2) {
        int16_t key;
        if (ctl_api_key(tok[1], &key) < 0) {
            ok = 0;
            snprintf(why, sizeof(why), "unknown ApiKey '%s'", tok[1]);
        } else {
            rd_kafka_mock_clear_request_errors(mc, key);
        }
    } else if (strcmp(cmd, "coordinator") == 0 && nt == 3) {
        long id = ctl_number(tok[2], 1, n_brokers, &n_ok);
        rd_kafka_resp_err_t e = n_ok ? rd_kafka_mock_coordinator_set(mc, "group", tok[1], (int32_t)id)
                                     : RD_KAFKA_RESP_ERR__INVALID_ARG;
        if (e) {
            ok = 0;
            snprintf(why, sizeof(why), "coordinator: %s",
                     n_ok ? rd_kafka_err2str(e) : "broker id out of range");
        }
    } else if (strcmp(cmd, "leader") == 0 && nt == 4) {
        int p_ok;
        long part = ctl_number(tok[2], 0, 1000000, &p_ok);
        long id = ctl_number(tok[3], 1, n_brokers, &n_ok);
        rd_kafka_resp_err_t e =
            p_ok && n_ok ? rd_kafka_mock_partition_set_leader(mc, tok[1], (int32_t)part, (int32_t)id)
                         : RD_KAFKA_RESP_ERR__INVALID_ARG;
        if (e) {
            ok = 0;
            snprintf(why, sizeof(why), "leader: %s",
                     p_ok && n_ok ? rd_kafka_err2str(e) : "bad partition or broker id");
        }
    } else {
        ok = 0;
        snprintf(why, sizeof(why), "unknown command or wrong arguments: %s (see kinfer broker --help)",
                 cmd);
    }
    if (ok) printf("ok\n");
    else printf("error %s\n", why);
    fflush(stdout);
}

/* The control channel's reading state: bytes of a partial line. */
struct ctl {
    int open;
    char buf[CTL_LINE_MAX];
    size_t used;
    int overlong; /* discarding the rest of a line that did not fit */
};

/* Waits up to wait_ms for stdin and executes every complete line that
 * arrived. EOF or a read error closes the channel for good (the broker
 * goes on); a signal just returns so the caller sees the stop flag. */
static void ctl_serve(struct ctl *c, rd_kafka_mock_cluster_t *mc, int n_brokers, int wait_ms)
{
    struct pollfd p = {.fd = 0, .events = POLLIN};
    int r = poll(&p, 1, wait_ms);
    if (r <= 0) {
        if (r < 0 && errno != EINTR) c->open = 0;
        return;
    }
    if (p.revents & (POLLNVAL | POLLERR)) {
        c->open = 0;
        return;
    }
    ssize_t n = read(0, c->buf + c->used, sizeof(c->buf) - 1 - c->used);
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {
        c->open = 0; /* EOF, or EIO from a terminal we do not own */
        return;
    }
    c->used += (size_t)n;
    char *start = c->buf, *nl;
    while ((nl = memchr(start, '\n', c->used - (size_t)(start - c->buf)))) {
        *nl = '\0';
        if (c->overlong) c->overlong = 0;
        else ctl_command(mc, n_brokers, start);
        start = nl + 1;
    }
    size_t rest = c->used - (size_t)(start - c->buf);
    memmove(c->buf, start, rest);
    c->used = rest;
    if (c->used == sizeof(c->buf) - 1) {
        if (!c->overlong) {
            printf("error line longer than %d bytes\n", CTL_LINE_MAX - 1);
            fflush(stdout);
        }
        c->overlong = 1;
        c->used = 0;
    }
}

/* Runs the cluster in this process until the stop flag; the control
 * channel is served between checks of the flag. */
int broker_run(const struct broker_opts *o, volatile sig_atomic_t *stop)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* The handle only hosts the cluster; keep its own logging quiet. */
    rd_kafka_conf_set(conf, "log_level", "3", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kinfer broker: %s\n", err);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, o->brokers);
    if (!mc) {
        fprintf(stderr, "kinfer broker: cannot start a mock cluster of %d brokers\n",
                o->brokers);
        rd_kafka_destroy(rk);
        return 1;
    }
    int rf = o->brokers < 3 ? o->brokers : 3;
    if (o->topics && *o->topics) {
        char *list = strdup(o->topics), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(mc, t, o->partitions, rf);
            if (e) {
                fprintf(stderr, "kinfer broker: topic %s: %s\n", t, rd_kafka_err2str(e));
                free(list);
                rd_kafka_mock_cluster_destroy(mc);
                rd_kafka_destroy(rk);
                return 1;
            }
        }
        free(list);
    }
    struct broker_fwd *fwd = NULL;
    if (o->port > 0 &&
        !(fwd = broker_fwd_start(o->port, rd_kafka_mock_cluster_bootstraps(mc), err,
                                 sizeof(err)))) {
        fprintf(stderr, "kinfer broker: --port %d: %s\n", o->port, err);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
        return 1;
    }
    if (fwd) printf("127.0.0.1:%d\n", o->port);
    else printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
    fflush(stdout);
    fprintf(stderr, "kinfer broker: %d broker(s), topics=%s partitions=%d; "
            "SIGINT or SIGTERM stops it; control commands on stdin\n", o->brokers,
            o->topics && *o->topics ? o->topics : "(auto-created)", o->partitions);
    /* Reading a terminal from a background process group would stop the
     * process (SIGTTIN); ignored, the read fails instead and the channel
     * closes. */
    signal(SIGTTIN, SIG_IGN);
    struct ctl ctl = {.open = 1};
    while (!*stop) {
        if (ctl.open) {
            ctl_serve(&ctl, mc, o->brokers, 50);
        } else {
            struct timespec ts = {0, 50 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    broker_fwd_stop(fwd);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}
