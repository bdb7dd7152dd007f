/* test_rconn.c - base/rconn: a Redis call that the server never answers
 * (a listening socket nobody reads, as a SIGSTOPped redis-server looks)
 * blocks until its timeout, unless another thread cancels it: then it
 * fails at once, and every later connect on the same guard fails without
 * touching the network. A guard that was never cancelled still connects.
 * A refused connect says so. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/rconn.h"
#include "testutil.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A loopback socket that listens and never accepts: connects succeed (the
 * kernel completes them), nothing is ever answered. *port receives its
 * port. */
static int silent_server(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

struct call {
    redisContext *ctx;
    double took;
    int failed;
};

/* A PING on the silent server, timed. */
static void *ping(void *arg)
{
    struct call *c = arg;
    double t0 = now_s();
    redisReply *r = redisCommand(c->ctx, "PING");
    c->took = now_s() - t0;
    c->failed = r == NULL;
    if (r) freeReplyObject(r);
    return NULL;
}

static void test_cancel_cuts_a_blocked_call(void **state)
{
    (void)state;
    int port;
    int srv = silent_server(&port);
    struct rconn_guard g;
    assert_int_equal(rconn_guard_init(&g), 0);
    struct rconn_conf c = {.host = "127.0.0.1", .port = port, .timeout_ms = 5000};
    char err[256];
    redisContext *ctx = rconn_open(&c, &g, err, sizeof(err));
    if (!ctx) fail_msg("rconn_open: %s", err);
    struct call call = {.ctx = ctx};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ping, &call), 0);
    usleep(200 * 1000);
    double t0 = now_s();
    rconn_cancel(&g);
    pthread_join(t, NULL);
    double after_cancel = now_s() - t0;
    fprintf(stderr, "test_rconn: PING blocked %.2f s, returned %.3f s after the cancel "
            "(timeout 5 s)\n", call.took, after_cancel);
    assert_true(call.failed);
    assert_true(after_cancel < 1.0);
    rconn_close(ctx, &g);
    /* Cancelled for good: no new connection. */
    t0 = now_s();
    assert_null(rconn_open(&c, &g, err, sizeof(err)));
    assert_string_equal(err, "cancelled");
    assert_true(now_s() - t0 < 0.5);
    rconn_cancel(&g); /* idempotent */
    rconn_guard_fini(&g);
    close(srv);
}

/* Without a cancel, the timeout is what ends the wait; a guard that was
 * not cancelled connects again after a close. */
static void test_timeout_still_bounds(void **state)
{
    (void)state;
    int port;
    int srv = silent_server(&port);
    struct rconn_guard g;
    assert_int_equal(rconn_guard_init(&g), 0);
    struct rconn_conf c = {.host = "127.0.0.1", .port = port, .timeout_ms = 300};
    char err[256];
    for (int i = 0; i < 2; i++) {
        redisContext *ctx = rconn_open(&c, &g, err, sizeof(err));
        if (!ctx) fail_msg("rconn_open: %s", err);
        struct call call = {.ctx = ctx};
        ping(&call);
        assert_true(call.failed);
        assert_true(call.took >= 0.25 && call.took < 3.0);
        rconn_close(ctx, &g);
    }
    rconn_guard_fini(&g);
    close(srv);
}

/* Nothing listening: refused at once, and the message says where. */
static void test_refused(void **state)
{
    (void)state;
    int port;
    int srv = silent_server(&port);
    close(srv); /* the port is free again: nothing listens on it */
    struct rconn_conf c = {.host = "127.0.0.1", .port = port, .timeout_ms = 2000};
    char err[256];
    assert_null(rconn_open(&c, NULL, err, sizeof(err)));
    char want[64];
    snprintf(want, sizeof(want), "connect 127.0.0.1:%d: ", port);
    if (strncmp(err, want, strlen(want)) != 0) fail_msg("error: %s", err);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel_cuts_a_blocked_call),
        cmocka_unit_test(test_timeout_still_bounds),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
