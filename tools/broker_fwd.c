/* broker_fwd.c - `kinfer broker --port N`: a fixed bootstrap address for
 * the mock cluster, whose brokers listen on ports the system picks anew
 * at every start. Connections to 127.0.0.1:N are relayed, bytes as they
 * are, to the first mock broker; a client there asks for metadata and
 * then talks to the brokers at the addresses it names (loopback), so only
 * bootstrap traffic passes through here, and a config naming
 * 127.0.0.1:N serves every start.
 *
 * Threads: an accepting thread, and one per relayed connection (few: a
 * client bootstraps once per handle). Ownership: a connection's thread
 * owns its two sockets and closes them. */
#include "broker_fwd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct broker_fwd {
    int lfd;
    struct sockaddr_in to;
    pthread_t thr;
    atomic_int stop;
};

struct pair {
    int a, b;
};

/* Writes all n bytes; 0, or -1 when the peer is gone. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Copies both ways until either side closes. */
static void *relay(void *arg)
{
    struct pair pr = *(struct pair *)arg;
    free(arg);
    char buf[65536];
    struct pollfd p[2] = {{pr.a, POLLIN, 0}, {pr.b, POLLIN, 0}};
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int done = 0;
        for (int i = 0; i < 2 && !done; i++) {
            if (!p[i].revents) continue;
            ssize_t n = recv(p[i].fd, buf, sizeof(buf), 0);
            if (n < 0 && errno == EINTR) continue;
            done = n <= 0 || write_all(p[1 - i].fd, buf, (size_t)n) < 0;
        }
        if (done) break;
    }
    close(pr.a);
    close(pr.b);
    return NULL;
}

static void *accepter(void *arg)
{
    struct broker_fwd *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {f->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        int c = accept(f->lfd, NULL, NULL);
        if (c < 0) continue;
        int u = socket(AF_INET, SOCK_STREAM, 0);
        if (u < 0 || connect(u, (const struct sockaddr *)&f->to, sizeof(f->to)) < 0) {
            fprintf(stderr, "kinfer broker: relaying a connection: %s\n", strerror(errno));
            if (u >= 0) close(u);
            close(c);
            continue;
        }
        struct pair *pr = malloc(sizeof(*pr));
        pthread_t t;
        if (!pr) {
            close(u);
            close(c);
            continue;
        }
        *pr = (struct pair){c, u};
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, relay, pr) != 0) {
            free(pr);
            close(u);
            close(c);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

struct broker_fwd *broker_fwd_start(int port, const char *bootstraps, char *err, size_t cap)
{
    /* the first of "host:port,host:port,..." (the mock's are 127.0.0.1) */
    const char *colon = strchr(bootstraps, ':');
    int to_port = colon ? atoi(colon + 1) : 0;
    if (to_port <= 0) {
        snprintf(err, cap, "no port in the cluster's address '%s'", bootstraps);
        return NULL;
    }
    struct broker_fwd *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    f->to.sin_family = AF_INET;
    f->to.sin_port = htons((uint16_t)to_port);
    f->to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (f->lfd < 0 || setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(f->lfd, (const struct sockaddr *)&a, sizeof(a)) < 0 || listen(f->lfd, 64) < 0) {
        snprintf(err, cap, "cannot listen on 127.0.0.1:%d: %s", port, strerror(errno));
        if (f->lfd >= 0) close(f->lfd);
        free(f);
        return NULL;
    }
    if (pthread_create(&f->thr, NULL, accepter, f) != 0) {
        snprintf(err, cap, "cannot start a thread");
        close(f->lfd);
        free(f);
        return NULL;
    }
    return f;
}

void broker_fwd_stop(struct broker_fwd *f)
{
    if (!f) return;
    atomic_store(&f->stop, 1);
    pthread_join(f->thr, NULL);
    close(f->lfd);
    free(f);
}
