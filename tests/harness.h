/* harness.h - real parts for integration tests: `kinfer broker` and
 * `redis-server` as child processes on free loopback ports, the worker as a
 * child process, and a librdkafka producer/consumer to drive them. Nothing
 * here mocks kinfer's dependencies: the tests talk the Kafka protocol and
 * RESP to real servers. Header-only, static functions; each test program
 * includes it once.
 *
 * Every child is put in its own process group and killed at exit, so a
 * failing assertion never leaves servers behind. */
#ifndef KINFER_HARNESS_H
#define KINFER_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every helper is static and may go unused by a given test program. */
#define H_FN static __attribute__((unused))

#define H_MAX_CHILDREN 16
static pid_t h_children[H_MAX_CHILDREN];
static char h_tmpdir[256];

H_FN double h_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

H_FN void h_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Kills every child still running (at exit and on demand). */
H_FN void h_kill_all(void)
{
    for (int i = 0; i < H_MAX_CHILDREN; i++) {
        if (h_children[i] > 0) {
            kill(-h_children[i], SIGKILL);
            waitpid(h_children[i], NULL, 0);
            h_children[i] = 0;
        }
    }
}

H_FN void h_forget(pid_t pid)
{
    for (int i = 0; i < H_MAX_CHILDREN; i++)
        if (h_children[i] == pid) h_children[i] = 0;
}

/* A fresh scratch directory for this program's files. */
H_FN const char *h_dir(void)
{
    if (!h_tmpdir[0]) {
        snprintf(h_tmpdir, sizeof(h_tmpdir), "/tmp/kinfer-test-XXXXXX");
        if (!mkdtemp(h_tmpdir)) {
            perror("mkdtemp");
            exit(1);
        }
        atexit(h_kill_all);
    }
    return h_tmpdir;
}

/* A TCP port nobody listens on right now (bound then released). */
H_FN int h_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts argv[0] with argv in its own process group; stdout goes to a pipe
 * returned in *out_fd when out_fd is non-NULL, else to log_path (or
 * inherited when NULL); stderr to log_path when given. Returns the pid. */
H_FN pid_t h_spawn(char *const argv[], int *out_fd, const char *log_path)
{
    int pfd[2] = {-1, -1};
    if (out_fd && pipe(pfd) < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        /* Die with the test program, even when it aborts (an assertion, a
         * sanitizer) and its atexit cleanup never runs. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (log_path) {
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 2);
                if (!out_fd) dup2(fd, 1);
                close(fd);
            }
        }
        if (out_fd) {
            dup2(pfd[1], 1);
            close(pfd[0]);
            close(pfd[1]);
        }
        execvp(argv[0], argv);
        perror(argv[0]);
        _exit(127);
    }
    setpgid(pid, pid);
    if (out_fd) {
        close(pfd[1]);
        *out_fd = pfd[0];
    }
    for (int i = 0; i < H_MAX_CHILDREN; i++)
        if (h_children[i] == 0) {
            h_children[i] = pid;
            break;
        }
    return pid;
}

/* Sends sig and waits up to timeout_s for the child; returns its exit
 * status (128+signal if killed), or -1 if it did not exit in time (it is
 * then killed). */
H_FN int h_stop(pid_t pid, int sig, double timeout_s)
{
    if (pid <= 0) return -1;
    kill(pid, sig);
    double until = h_now() + timeout_s;
    int st;
    while (h_now() < until) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            h_forget(pid);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        h_sleep_ms(20);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &st, 0);
    h_forget(pid);
    return -1;
}

/* 1 if the child has exited (status in *status), else 0. */
H_FN int h_exited(pid_t pid, int *status)
{
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
        h_forget(pid);
        *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return 1;
    }
    return 0;
}

/* Starts `kinfer broker`; copies its bootstrap list into brokers. */
H_FN pid_t h_start_broker(const char *kinfer, const char *topics, int partitions,
                            char *brokers, size_t cap)
{
    char parts[16], log[300];
    snprintf(parts, sizeof(parts), "%d", partitions);
    snprintf(log, sizeof(log), "%s/broker.log", h_dir());
    char *argv[] = {(char *)kinfer, "broker", "--partitions", parts, "--topics",
                    (char *)topics, NULL};
    int fd;
    pid_t pid = h_spawn(argv, &fd, log);
    size_t n = 0;
    char c;
    while (n + 1 < cap && read(fd, &c, 1) == 1 && c != '\n') brokers[n++] = c;
    brokers[n] = '\0';
    close(fd);
    return n ? pid : -1;
}

/* Starts redis-server on a free port without persistence; waits until it
 * answers PING. Returns the pid, port in *port. */
H_FN pid_t h_start_redis(int *port)
{
    *port = h_free_port();
    char p[16], log[300];
    snprintf(p, sizeof(p), "%d", *port);
    snprintf(log, sizeof(log), "%s/redis.log", h_dir());
    char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", (char *)h_dir(), NULL};
    pid_t pid = h_spawn(argv, NULL, log);
    for (int i = 0; i < 200; i++) {
        redisContext *c = redisConnect("127.0.0.1", *port);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            redisFree(c);
            if (ok) return pid;
        } else if (c) {
            redisFree(c);
        }
        h_sleep_ms(25);
    }
    return -1;
}

/* Records whose delivery failed (their keys, the first H_DR_KEEP), counted
 * by every harness producer's delivery report and said on stderr, so a
 * test can send them again instead of waiting for answers that cannot
 * come. */
#define H_DR_KEEP 64
static char h_dr_keys[H_DR_KEEP][128];
static size_t h_dr_failed;

H_FN void h_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (!m->err) return;
    fprintf(stderr, "harness: delivery of key %.*s failed: %s\n", (int)m->key_len,
            (const char *)m->key, rd_kafka_err2str(m->err));
    if (h_dr_failed < H_DR_KEEP)
        snprintf(h_dr_keys[h_dr_failed], sizeof(h_dr_keys[0]), "%.*s", (int)m->key_len,
                 (const char *)m->key);
    h_dr_failed++;
}

/* A producer to the harness cluster with idempotence on. */
H_FN rd_kafka_t *h_producer(const char *brokers)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_dr_msg_cb(conf, h_dr_cb);
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err));
    rd_kafka_conf_set(conf, "linger.ms", "2", err, sizeof(err));
    return rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
}

/* Produces one record (copied) with an optional content-type header. */
H_FN int h_produce(rd_kafka_t *p, const char *topic, const void *key, size_t key_len,
                     const void *val, size_t len, const char *content_type)
{
    rd_kafka_resp_err_t e;
    do {
        if (content_type)
            e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, key_len),
                                  RD_KAFKA_V_VALUE((void *)val, len),
                                  RD_KAFKA_V_HEADER("content-type", content_type, -1),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        else
            e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, key_len),
                                  RD_KAFKA_V_VALUE((void *)val, len),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) rd_kafka_poll(p, 10);
    } while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
    rd_kafka_poll(p, 0);
    return e ? -1 : 0;
}

/* A consumer that reads topic from the beginning, outside any group's
 * committed offsets (its own throwaway group). */
H_FN rd_kafka_t *h_reader(const char *brokers, const char *topic)
{
    char err[512], group[64];
    snprintf(group, sizeof(group), "reader-%d-%ld", getpid(), (long)random());
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", group, err, sizeof(err));
    rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err));
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!c) return NULL;
    rd_kafka_poll_set_consumer(c);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(c, l);
    rd_kafka_topic_partition_list_destroy(l);
    return c;
}

/* The committed offsets of group on topic's partitions 0..n-1, summed
 * (-1 for a partition with none counts as 0). */
H_FN long long h_committed_sum(const char *brokers, const char *group, const char *topic,
                                 int n)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", group, err, sizeof(err));
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) rd_kafka_topic_partition_list_add(l, topic, i);
    long long sum = -1;
    if (rd_kafka_committed(c, l, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        sum = 0;
        for (int i = 0; i < n; i++)
            if (l->elems[i].offset > 0) sum += l->elems[i].offset;
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(c);
    return sum;
}

#endif
