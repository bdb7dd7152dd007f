/* rconn.c - Redis connections that another thread can cut short (rconn.h).
 *
 * The connect is kinfer's own (a non-blocking connect polled in
 * RCONN_SLICE_MS slices that watch the guard), then handed to hiredis with
 * redisConnectFd, so a stop never waits out a connect to an address that
 * does not answer. Once connected, the socket is attached to the guard
 * under its mutex; rconn_cancel shuts it down under the same mutex, and
 * rconn_close detaches it before hiredis closes it, so a cancel can never
 * reach a descriptor number that has been closed and reused.
 *
 * Threads: see rconn.h. */
#include "rconn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

int rconn_guard_init(struct rconn_guard *g)
{
    g->fd = -1;
    g->cancelled = 0;
    return pthread_mutex_init(&g->mu, NULL) == 0 ? 0 : -1;
}

void rconn_guard_fini(struct rconn_guard *g)
{
    pthread_mutex_destroy(&g->mu);
}

void rconn_cancel(struct rconn_guard *g)
{
    pthread_mutex_lock(&g->mu);
    g->cancelled = 1;
    if (g->fd >= 0) shutdown(g->fd, SHUT_RDWR);
    pthread_mutex_unlock(&g->mu);
}

static int cancelled(struct rconn_guard *g)
{
    if (!g) return 0;
    pthread_mutex_lock(&g->mu);
    int c = g->cancelled;
    pthread_mutex_unlock(&g->mu);
    return c;
}

/* A connected, blocking TCP socket to one address, or -1 with err filled.
 * The connect waits at most until give_up_ms, in slices that watch g. */
static int connect_addr(const struct addrinfo *ai, int64_t give_up_ms, struct rconn_guard *g,
                        char *err, size_t cap)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
    if (fd < 0) {
        snprintf(err, cap, "socket: %s", strerror(errno));
        return -1;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    int e = rc == 0 ? 0 : errno;
    while (e == EINPROGRESS) {
        if (cancelled(g)) {
            snprintf(err, cap, "cancelled");
            close(fd);
            return -1;
        }
        int64_t left = give_up_ms - clock_mono_ms();
        if (left <= 0) {
            e = ETIMEDOUT;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, left < RCONN_SLICE_MS ? (int)left : RCONN_SLICE_MS);
        if (n < 0 && errno != EINTR) {
            e = errno;
            break;
        }
        if (n > 0) {
            socklen_t len = sizeof(e);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0) e = errno;
        }
    }
    if (e) {
        snprintf(err, cap, "%s", e == ETIMEDOUT ? "Connection timed out" : strerror(e));
        close(fd);
        return -1;
    }
    /* hiredis's blocking context expects a blocking socket. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Runs AUTH or SELECT; on an error reply or none, fills err with what
 * Redis said (or why there was no reply) and returns -1. */
static int setup_cmd(redisContext *ctx, int argc, const char **argv, char *err, size_t cap)
{
    redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
    int ok = r && r->type != REDIS_REPLY_ERROR;
    if (!ok)
        snprintf(err, cap, "%s: %s", argv[0],
                 r ? r->str : ctx->errstr[0] ? ctx->errstr : "no reply");
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

redisContext *rconn_open(const struct rconn_conf *c, struct rconn_guard *g, char *err,
                         size_t cap)
{
    char port[16], why[256] = "no address";
    snprintf(port, sizeof(port), "%d", c->port);
    if (cancelled(g)) {
        snprintf(err, cap, "cancelled");
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(c->host, port, &hints, &res);
    if (gai != 0) {
        snprintf(err, cap, "connect %s:%d: %s", c->host, c->port, gai_strerror(gai));
        return NULL;
    }
    int64_t give_up = clock_mono_ms() + (c->timeout_ms > 0 ? c->timeout_ms : 2000);
    int fd = -1;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = connect_addr(ai, give_up, g, why, sizeof(why));
    freeaddrinfo(res);
    if (fd < 0) {
        if (strcmp(why, "cancelled") == 0) snprintf(err, cap, "cancelled");
        else snprintf(err, cap, "connect %s:%d: %s", c->host, c->port, why);
        return NULL;
    }
    redisContext *ctx = redisConnectFd(fd);
    if (!ctx || ctx->err) {
        snprintf(err, cap, "connect %s:%d: %s", c->host, c->port,
                 ctx ? ctx->errstr : "out of memory");
        if (ctx) redisFree(ctx); /* closes fd */
        else close(fd);
        return NULL;
    }
    if (g) {
        pthread_mutex_lock(&g->mu);
        int gone = g->cancelled;
        if (!gone) g->fd = fd;
        pthread_mutex_unlock(&g->mu);
        if (gone) {
            redisFree(ctx);
            snprintf(err, cap, "cancelled");
            return NULL;
        }
    }
    struct timeval tv = {.tv_sec = c->timeout_ms / 1000,
                         .tv_usec = (c->timeout_ms % 1000) * 1000};
    if (c->timeout_ms > 0 && redisSetTimeout(ctx, tv) != REDIS_OK) {
        snprintf(err, cap, "connect %s:%d: cannot set the command timeout", c->host, c->port);
        rconn_close(ctx, g);
        return NULL;
    }
    if (c->password && c->password[0]) {
        const char *argv[] = {"AUTH", c->password};
        if (setup_cmd(ctx, 2, argv, err, cap) < 0) {
            rconn_close(ctx, g);
            return NULL;
        }
    }
    if (c->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", c->db);
        const char *argv[] = {"SELECT", db};
        if (setup_cmd(ctx, 2, argv, err, cap) < 0) {
            rconn_close(ctx, g);
            return NULL;
        }
    }
    return ctx;
}

void rconn_close(redisContext *ctx, struct rconn_guard *g)
{
    if (!ctx) return;
    if (g) {
        pthread_mutex_lock(&g->mu);
        if (g->fd == ctx->fd) g->fd = -1;
        pthread_mutex_unlock(&g->mu);
    }
    redisFree(ctx);
}
