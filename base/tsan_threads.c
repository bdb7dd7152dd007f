/* tsan_threads.c - C11 threads made visible to ThreadSanitizer, in a
 * ThreadSanitizer build only (make SANITIZE=thread); empty otherwise.
 *
 * librdkafka starts its threads with C11's thrd_create. glibc's
 * thrd_create (2.34 on) starts the thread without going through
 * pthread_create, which is where ThreadSanitizer learns of a thread, so
 * the thread's first allocation dereferences sanitizer state that was
 * never made and the process dies at startup. These definitions take the
 * place of glibc's for the whole process (the executable's symbols come
 * first) and go through pthread_create and pthread_join, which the
 * sanitizer intercepts. Its mutexes and condition variables likewise
 * (glibc's mtx_ and cnd_ calls bypass the intercepted pthread calls, so
 * the sanitizer would see memory handed between librdkafka's threads
 * under a lock as a race): glibc's thrd_t is a pthread_t, mtx_t and
 * cnd_t share pthread_mutex_t's and pthread_cond_t's layout. */
#ifdef __SANITIZE_THREAD__

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

struct tsan_start {
    thrd_start_t fn;
    void *arg;
};

static void *tsan_trampoline(void *p)
{
    struct tsan_start s = *(struct tsan_start *)p;
    free(p);
    return (void *)(intptr_t)s.fn(s.arg);
}

int thrd_create(thrd_t *thr, thrd_start_t func, void *arg)
{
    struct tsan_start *s = malloc(sizeof(*s));
    if (!s) return thrd_nomem;
    s->fn = func;
    s->arg = arg;
    pthread_t t;
    int rc = pthread_create(&t, NULL, tsan_trampoline, s);
    if (rc) {
        free(s);
        return rc == ENOMEM || rc == EAGAIN ? thrd_nomem : thrd_error;
    }
    *thr = (thrd_t)t;
    return thrd_success;
}

int thrd_join(thrd_t thr, int *res)
{
    void *r = NULL;
    if (pthread_join((pthread_t)thr, &r)) return thrd_error;
    if (res) *res = (int)(intptr_t)r;
    return thrd_success;
}

int thrd_detach(thrd_t thr)
{
    return pthread_detach((pthread_t)thr) ? thrd_error : thrd_success;
}

_Static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t) &&
               sizeof(cnd_t) == sizeof(pthread_cond_t), "C11 and POSIX types differ");
#define TSAN_M(m) ((pthread_mutex_t *)(void *)(m))
#define TSAN_C(c) ((pthread_cond_t *)(void *)(c))

static int tsan_rc(int rc)
{
    return rc == 0 ? thrd_success : rc == ETIMEDOUT ? thrd_timedout : rc == EBUSY ? thrd_busy
                                                                                 : thrd_error;
}

int mtx_init(mtx_t *m, int type)
{
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (rc) return tsan_rc(rc);
    if (type & mtx_recursive) rc = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    if (!rc) rc = pthread_mutex_init(TSAN_M(m), &a);
    pthread_mutexattr_destroy(&a);
    return tsan_rc(rc);
}

int mtx_lock(mtx_t *m) { return tsan_rc(pthread_mutex_lock(TSAN_M(m))); }
int mtx_trylock(mtx_t *m) { return tsan_rc(pthread_mutex_trylock(TSAN_M(m))); }
int mtx_unlock(mtx_t *m) { return tsan_rc(pthread_mutex_unlock(TSAN_M(m))); }
void mtx_destroy(mtx_t *m) { pthread_mutex_destroy(TSAN_M(m)); }

int mtx_timedlock(mtx_t *restrict m, const struct timespec *restrict ts)
{
    return tsan_rc(pthread_mutex_timedlock(TSAN_M(m), ts));
}

int cnd_init(cnd_t *c) { return tsan_rc(pthread_cond_init(TSAN_C(c), NULL)); }
int cnd_signal(cnd_t *c) { return tsan_rc(pthread_cond_signal(TSAN_C(c))); }
int cnd_broadcast(cnd_t *c) { return tsan_rc(pthread_cond_broadcast(TSAN_C(c))); }
void cnd_destroy(cnd_t *c) { pthread_cond_destroy(TSAN_C(c)); }

int cnd_wait(cnd_t *c, mtx_t *m)
{
    return tsan_rc(pthread_cond_wait(TSAN_C(c), TSAN_M(m)));
}

int cnd_timedwait(cnd_t *restrict c, mtx_t *restrict m, const struct timespec *restrict ts)
{
    return tsan_rc(pthread_cond_timedwait(TSAN_C(c), TSAN_M(m), ts));
}

#else

/* ISO C wants a translation unit to declare something. */
typedef int kinfer_tsan_threads_unused;

#endif
