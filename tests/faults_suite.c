/* faults_suite.c - the worker-side fault suite of docs/reliability.md, against
 * real parts: `kinfer broker` (its own process, so killing the worker
 * leaves the cluster up), a real redis-server (with an append-only file, so
 * a Redis restart keeps what it acknowledged), and the worker binary. Each
 * test produces jobs whose correct outputs the test computes in float64,
 * injects its fault, lets the worker drain, then runs one checker that
 * counts per job id lost, wrong, duplicates and rewinds (committed offsets
 * sampled every 100 ms for the whole test). The runs, the sampler and the
 * checker live in faults.h, shared with faults_broker.c; this file holds
 * the restartable Redis and the rows. The figures go to stderr (lines
 * starting FIGURES) for docs/reliability.md. `make test-faults` runs it
 * (minutes); `make test` does not. */
#include "faults.h"
#include "../kafka/kq.h"

static pid_t redis_pid;

/* ---- Redis that survives a restart ------------------------------------------ */

/* Starts redis-server on port with an append-only file in the scratch
 * directory, so a restart on the same port keeps what it acknowledged;
 * waits until it answers PING. Returns the pid or -1. */
static pid_t start_redis_on(int port)
{
    char p[16], log[300], dir[300];
    snprintf(p, sizeof(p), "%d", port);
    snprintf(log, sizeof(log), "%s/redis.log", h_dir());
    snprintf(dir, sizeof(dir), "%s", h_dir());
    /* appendfsync always: what Redis acknowledged survives its restart. */
    char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "yes", "--appendfsync", "always", "--dir", dir, NULL};
    pid_t pid = h_spawn(argv, NULL, log);
    for (int i = 0; i < 400; i++) {
        redisContext *c = redisConnect("127.0.0.1", port);
        int ok = 0;
        if (c && !c->err) {
            redisReply *rep = redisCommand(c, "PING");
            ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep) freeReplyObject(rep);
        }
        if (c) redisFree(c);
        if (ok) return pid;
        h_sleep_ms(25);
    }
    return -1;
}

/* ---- the tests -------------------------------------------------------------- */

/* kill -9 mid-batch, repeatedly, restarting each time: each kill comes
 * once the new worker has made progress (so it is mid-load, not mid-join). */
static void test_crash_kill9_repeatedly(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "crash", 5000, NULL);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker(&r);
    int kills = 0;
    for (int k = 0; k < 6; k++) {
        size_t before = f_results_now(&r);
        double until = h_now() + 60;
        size_t step = 150 + tu_rand64() % 300;
        while (h_now() < until && f_results_now(&r) < before + step && f_results_now(&r) < r.n)
            h_sleep_ms(20);
        if (f_results_now(&r) >= r.n) break;
        h_stop(r.worker, SIGKILL, 5);
        kills++;
        f_start_worker(&r);
    }
    size_t have = f_wait_all(&r, 180);
    fprintf(stderr, "crash: %d kill -9 cycles, %zu of %zu results in Redis\n", kills, have, r.n);
    assert_true(kills >= 3);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_finish_clean(&r);
}

/* Whether the log file at path holds a line with needle. */
static int log_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* Crash recovery (docs/reliability.md, "Crash recovery"): two workers
 * share the partitions while jobs arrive at 100 a second; one is killed
 * with kill -9. The figure is the seconds from the kill until every
 * partition's committed offset has moved again, i.e. until the killed
 * worker's partitions are consumed by the other. The workers run on
 * kinfer's own membership defaults (session.timeout.ms 10000), not the
 * suite's short timeout: this row measures what an operator gets. The
 * embedded broker does not honour static membership, so a restart under
 * the same id is not measured here (README, "The embedded broker"). */
static void test_kill9_recovery(void **state)
{
    (void)state;
    struct f_run r;
    const char *suite_props = f_session_props;
    f_session_props = "";
    f_run_init(&r, "recover", 5000, NULL);
    f_session_props = suite_props;
    f_start_sampler(&r);
    f_produce_paced(&r, 0, 100.0);
    pid_t a = f_spawn_worker(&r, "a", NULL);
    pid_t b = f_spawn_worker(&r, "b", NULL);
    char log_a[300], log_b[300];
    snprintf(log_a, sizeof(log_a), "%s/recover.a.log", h_dir());
    snprintf(log_b, sizeof(log_b), "%s/recover.b.log", h_dir());

    /* Steady state first: both members hold partitions, and every
     * partition's committed offset moves. */
    rd_kafka_t *c = f_offsets_reader(&r);
    assert_non_null(c);
    long long before[F_PARTS], now[F_PARTS];
    int steady = 0;
    for (double until = h_now() + 60; !steady && h_now() < until;) {
        h_sleep_ms(500);
        if (!log_has(log_a, "event=partitions_assigned") ||
            !log_has(log_b, "event=partitions_assigned") || f_committed(&r, c, before) < 0)
            continue;
        h_sleep_ms(2000);
        if (f_committed(&r, c, now) < 0) continue;
        steady = 1;
        for (int p = 0; p < F_PARTS; p++) steady &= now[p] > before[p] && before[p] >= 0;
    }
    assert_true(steady);

    h_stop(a, SIGKILL, 5);
    double t_kill = h_now();
    /* What the killed worker committed before it died is visible within
     * one commit interval (100 ms) and one read: take the marks after. */
    h_sleep_ms(500);
    long long mark[F_PARTS];
    assert_int_equal(f_committed(&r, c, mark), 0);
    double moved_at[F_PARTS] = {0};
    int n_moved = 0, stalled = 0;
    while (n_moved < F_PARTS && h_now() < t_kill + 120) {
        if (f_committed(&r, c, now) == 0)
            for (int p = 0; p < F_PARTS; p++)
                if (!moved_at[p] && now[p] > mark[p]) {
                    moved_at[p] = h_now();
                    n_moved++;
                    if (moved_at[p] - t_kill > 2.0) stalled++;
                }
        h_sleep_ms(100);
    }
    rd_kafka_destroy(c);
    /* The session timeout the workers ran with: kinfer's default. */
    struct kcfg kc;
    memset(&kc, 0, sizeof(kc));
    kc.kafka.brokers = f_brokers;
    kc.kafka.group = r.group;
    char err[256], timeout_ms[32] = "?";
    size_t tn = sizeof(timeout_ms);
    rd_kafka_conf_t *kconf = kq_conf_new(&kc, KQ_CONSUMER, err, sizeof(err));
    assert_non_null(kconf);
    rd_kafka_conf_get(kconf, "session.timeout.ms", timeout_ms, &tn);
    rd_kafka_conf_destroy(kconf);
    double recovered = 0;
    for (int p = 0; p < F_PARTS; p++)
        if (moved_at[p] - t_kill > recovered) recovered = moved_at[p] - t_kill;
    fprintf(stderr, "FIGURES recover: session_timeout_ms=%s partitions_stalled=%d of %d "
            "seconds_to_all_partitions=%.1f\n", timeout_ms, stalled, F_PARTS, recovered);
    /* Liveness, not a timing: every partition is consumed again. */
    assert_int_equal(n_moved, F_PARTS);
    pthread_join(r.producer, NULL);
    assert_int_equal(atomic_load(&r.produced), r.n);
    assert_int_equal(f_wait_all(&r, 180), r.n);
    assert_int_equal(h_stop(b, SIGTERM, 30), 0);
    f_finish_clean(&r);
}

/* Partitions a worker's log says it owns: every partitions_assigned count
 * minus every partitions_revoked and partitions_lost count (an eager
 * revoke takes all, a cooperative one a subset: the sum serves both). */
static int owned_in_log(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int owned = 0;
    while (fgets(line, sizeof(line), f)) {
        int sign = strstr(line, "event=partitions_assigned") ? 1
                   : strstr(line, "event=partitions_revoked") || strstr(line, "event=partitions_lost")
                       ? -1
                       : 0;
        const char *c = sign ? strstr(line, " count=") : NULL;
        if (c) owned += sign * atoi(c + 7);
    }
    fclose(f);
    return owned;
}

/* Scale-out and scale-in (docs/reliability.md, "Scale-out and scale-in"):
 * one worker owns the partitions while jobs arrive at 100 a second; a second
 * joins, and the figure is the seconds from its start until every
 * partition is owned again, split between the two, and how long some
 * partition had no owner; then the second gets SIGTERM and the figure is
 * the seconds until the first owns them all again. The workers run with
 * the embedded broker's membership settings (README, "The embedded
 * broker and group membership"): session.timeout.ms 4000,
 * heartbeat.interval.ms 500. The mock group waits session.timeout.ms
 * minus one second for members before each assignment, so kinfer's own
 * 10000 takes 9 s here. The bound asserted is generous (the machines are
 * shared); the figures are printed. */
static void test_scale_handover(void **state)
{
    (void)state;
    struct f_run r;
    const char *suite_props = f_session_props;
    f_session_props = "( \"session.timeout.ms\", \"4000\" ), ( \"heartbeat.interval.ms\", \"500\" )";
    f_run_init(&r, "handover", 3000, NULL);
    f_session_props = suite_props;
    f_start_sampler(&r);
    f_produce_paced(&r, 0, 100.0);
    char log_a[300], log_b[300];
    snprintf(log_a, sizeof(log_a), "%s/handover.a.log", h_dir());
    snprintf(log_b, sizeof(log_b), "%s/handover.b.log", h_dir());
    pid_t a = f_spawn_worker(&r, "a", NULL);
    for (double until = h_now() + 60; owned_in_log(log_a) != F_PARTS && h_now() < until;)
        h_sleep_ms(50);
    assert_int_equal(owned_in_log(log_a), F_PARTS);
    h_sleep_ms(1000);

    /* Scale-out. */
    double t_out = h_now(), unowned_since = 0, unowned_s = 0;
    pid_t b = f_spawn_worker(&r, "b", NULL);
    double out_s = -1;
    while (h_now() < t_out + 60) {
        int oa = owned_in_log(log_a), ob = owned_in_log(log_b);
        double now = h_now();
        if (oa + ob < F_PARTS && !unowned_since) unowned_since = now;
        if (oa + ob == F_PARTS && unowned_since) {
            unowned_s += now - unowned_since;
            unowned_since = 0;
        }
        if (oa + ob == F_PARTS && oa > 0 && ob > 0) {
            out_s = now - t_out;
            break;
        }
        h_sleep_ms(20);
    }
    assert_true(out_s >= 0);
    h_sleep_ms(1000);

    /* Scale-in: the second leaves cleanly. */
    double t_in = h_now();
    assert_int_equal(kill(b, SIGTERM), 0);
    double in_s = -1;
    while (h_now() < t_in + 60) {
        if (owned_in_log(log_a) == F_PARTS) {
            in_s = h_now() - t_in;
            break;
        }
        h_sleep_ms(20);
    }
    /* Its exit status, without a second signal. */
    int st = -1;
    for (double until = h_now() + 30; h_now() < until; h_sleep_ms(20))
        if (waitpid(b, &st, WNOHANG) == b) {
            h_forget(b);
            break;
        }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    fprintf(stderr,
            "FIGURES handover: scale_out_s=%.2f (partitions without an owner %.2f s) "
            "scale_in_s=%.2f\n",
            out_s, unowned_s, in_s);
    assert_true(in_s >= 0);
    /* Generous bounds: about 3 s each on an idle machine. */
    assert_true(out_s < 5.0);
    assert_true(in_s < 5.0);
    pthread_join(r.producer, NULL);
    assert_int_equal(atomic_load(&r.produced), r.n);
    assert_int_equal(f_wait_all(&r, 180), r.n);
    assert_int_equal(h_stop(a, SIGTERM, 30), 0);
    f_finish_clean(&r);
}

/* Redis stopped for 10 s mid-load, then restarted (with what it had
 * acknowledged): nothing lost, committed offsets never rewind. */
static void test_redis_outage(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "rdown", 3000, NULL);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker(&r);
    h_sleep_ms(1500);
    assert_int_equal(h_stop(redis_pid, SIGTERM, 10), 0);
    double t0 = h_now();
    h_sleep_ms(10000);
    redis_pid = start_redis_on(f_redis_port);
    assert_true(redis_pid > 0);
    fprintf(stderr, "rdown: Redis down for %.1f s\n", h_now() - t0);
    size_t have = f_wait_all(&r, 120);
    assert_int_equal(have, r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_finish_clean(&r);
}

/* Redis stops answering (SIGSTOP): the worker must not hang. A SIGTERM
 * during the blackhole still ends it within worker.drain_timeout_ms (3 s),
 * although every Redis call may block for redis.timeout_ms (6 s, twice the
 * drain timeout) and the heartbeat writes a hash it must DEL on the way
 * out: the calls that hold the stop are cut short. What the worker could
 * not write is run again after Redis comes back. */
static void test_redis_blackhole(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "rhole", 2000, NULL);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    static const char *const sets[] = {"worker.drain_timeout_ms=3000", "redis.timeout_ms=6000",
                                       "metrics.heartbeat_prefix=kinfer:worker:", NULL};
    f_start_worker_with(&r, sets);
    h_sleep_ms(1500);
    kill(redis_pid, SIGSTOP);
    h_sleep_ms(3000);
    double t0 = h_now();
    int st = h_stop(r.worker, SIGTERM, 30);
    double took = h_now() - t0;
    fprintf(stderr, "rhole: SIGTERM during the blackhole: exit %d after %.2f s "
            "(drain_timeout_ms 3000, redis.timeout_ms 6000, heartbeat hash on)\n", st, took);
    kill(redis_pid, SIGCONT); /* before any assertion: the rows after need Redis */
    assert_int_equal(st, 0);
    assert_true(took <= 3.5);
    f_start_worker(&r);
    assert_int_equal(f_wait_all(&r, 120), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_stop_sampler(&r);
    char extra[64];
    snprintf(extra, sizeof(extra), "stop_s=%.2f", took);
    struct f_verdict v = f_check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    f_run_fini(&r);
}

/* SIGTERM mid-load: jobs finished before the signal are not run again. */
static void test_sigterm_no_duplicates(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "term", 4000, NULL);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker(&r);
    h_sleep_ms(2500);
    double t0 = h_now();
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    fprintf(stderr, "term: SIGTERM exit after %.2f s\n", h_now() - t0);
    f_start_worker(&r);
    assert_int_equal(f_wait_all(&r, 120), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_stop_sampler(&r);
    struct f_verdict v = f_check(&r, NULL);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(v.dup_total, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    f_run_fini(&r);
}

/* A job that kills the worker every time (debug.crash_id): its attempt
 * counter makes it a suspect after the first crash (it runs alone, so its
 * batch-mates finish) and it is answered inference_failed once counted
 * more than worker.max_attempts (3) times; the partition moves on. */
static void test_poison_crash_loop(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "poison", 400, NULL);
    r.poison_id = r.ids[150];
    char set[64];
    snprintf(set, sizeof(set), "debug.crash_id=%s", r.poison_id);
    const char *sets[] = {set, NULL};
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker_with(&r, sets);
    int crashes = 0, st;
    double until = h_now() + 150;
    while (h_now() < until && f_results_now(&r) < r.n) {
        if (h_exited(r.worker, &st)) {
            crashes++;
            fprintf(stderr, "poison: worker exited %d (crash %d); restarting\n", st, crashes);
            assert_true(crashes <= 6);
            f_start_worker_with(&r, sets);
        }
        h_sleep_ms(50);
    }
    assert_int_equal(f_results_now(&r), r.n);
    fprintf(stderr, "poison: %d crashes before the job was answered\n", crashes);
    assert_true(crashes >= 1 && crashes <= 4); /* max_attempts = 3 */
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_finish_clean(&r);
}

/* An executor that never returns (debug.hang_id): the watchdog ends the
 * process within its bound; the restart loses nothing. */
static void test_hung_executor_watchdog(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "hang", 600, NULL);
    char set[64];
    snprintf(set, sizeof(set), "debug.hang_id=%s", r.ids[300]);
    const char *sets[] = {set, "metrics.watchdog_ms=2000", "metrics.heartbeat_interval_ms=500",
                          NULL};
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker_with(&r, sets);
    int st = -1;
    double t0 = h_now(), exited_at = 0;
    while (h_now() < t0 + 90) {
        if (h_exited(r.worker, &st)) {
            exited_at = h_now();
            break;
        }
        h_sleep_ms(50);
    }
    assert_true(exited_at > 0);
    assert_int_equal(st, 2);
    char log[300], line[512];
    snprintf(log, sizeof(log), "%s/hang.worker.log", h_dir());
    FILE *f = fopen(log, "r");
    double hung = 0;
    int saw_exit = 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, "event=debug_hang")) hung = 1;
        if (strstr(line, "event=watchdog_exit")) saw_exit = 1;
    }
    if (f) fclose(f);
    assert_true(hung && saw_exit);
    fprintf(stderr, "hang: worker exited %d, %.1f s after start (watchdog_ms 2000)\n", st,
            exited_at - t0);
    f_start_worker(&r); /* without the failpoint */
    assert_int_equal(f_wait_all(&r, 120), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_finish_clean(&r);
}

/* Each batch takes twice max.poll.interval.ms: the poll thread keeps
 * polling, so the worker is never evicted from its group. */
static void test_slow_executor_no_eviction(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "slow", 48, NULL);
    const char *sets[] = {"debug.batch_sleep_ms=12000", "kafka.properties.max.poll.interval.ms=6000",
                          NULL};
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker_with(&r, sets);
    assert_int_equal(f_wait_all(&r, 240), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 60), 0);
    f_stop_sampler(&r);
    char log[300], line[1024];
    snprintf(log, sizeof(log), "%s/slow.worker.log", h_dir());
    FILE *f = fopen(log, "r");
    int assigned = 0, lost_or_revoked = 0, poll_exceeded = 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, "event=partitions_assigned")) assigned++;
        if (strstr(line, "event=partitions_lost")) lost_or_revoked++;
        if (strstr(line, "MAXPOLL") || strstr(line, "max.poll.interval.ms")) poll_exceeded++;
    }
    if (f) fclose(f);
    fprintf(stderr, "slow: assignments=%d lost=%d max.poll.interval warnings=%d\n", assigned,
            lost_or_revoked, poll_exceeded);
    assert_int_equal(assigned, 1);
    assert_int_equal(lost_or_revoked, 0);
    struct f_verdict v = f_check(&r, NULL);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    f_run_fini(&r);
}

/* Hostile records among good jobs: each is dead-lettered or answered
 * invalid_input, the worker does not crash, and the good jobs are right. */
static void test_hostile_input(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "hostile", 200, NULL);
    const char *sets[] = {"worker.max_payload_bytes=65536", NULL};
    f_start_sampler(&r);
    rd_kafka_t *p = h_producer(f_brokers);
    static unsigned char big[100000];
    memset(big, 0x41, sizeof(big));
    unsigned char deep[64] = {0x81, 0xa4, 'm', 'e', 't', 'a'};
    for (int i = 6; i < 46; i++) deep[i] = 0x91;
    deep[46] = 0xc0;
    unsigned char chain[96];
    for (int i = 0; i < 32; i++) memcpy(chain + 3 * i, "\xdc\xff\xff", 3);
    char longid[10300];
    int n = snprintf(longid, sizeof(longid), "{\"id\":\"");
    memset(longid + n, 'x', 10000);
    n += 10000;
    n += snprintf(longid + n, sizeof(longid) - (size_t)n, "\",\"input\":[1,2,3,4,5,6,7,8]}");
    const char *nan_json = "{\"id\":\"hostile-nan\",\"input\":[1,2,3,NaN,5,6,7,8]}";
    struct {
        const void *p;
        size_t len;
    } bad[] = {
        {"\xdf\x10\x00\x00\x00", 5}, {chain, sizeof(chain)},  {deep, 47},
        {longid, (size_t)n},         {"\x81\xa2id", 4},       {big, sizeof(big)},
        {nan_json, strlen(nan_json)}, {"{\"id\":7,\"input\":\"x\"}", 21},
    };
    size_t nb = sizeof(bad) / sizeof(bad[0]);
    for (size_t i = 0; i < r.n; i++) {
        if (i % 25 == 0 && i / 25 < nb)
            assert_int_equal(h_produce(p, r.topic, NULL, 0, bad[i / 25].p, bad[i / 25].len, NULL), 0);
        struct wire_job j = {.id = r.ids[i], .input = r.in[i], .n_input = F_IN_W,
                             .timeout_ms = -1, .priority = -1};
        if (i == 199) j.n_input = F_IN_W - 3; /* wrong width: answered invalid_input */
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(p, r.topic, r.ids[i], strlen(r.ids[i]), body, len, NULL), 0);
        free(body);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);
    f_start_worker_with(&r, sets);
    assert_int_equal(f_wait_all(&r, 60), r.n);
    h_sleep_ms(500);
    int st;
    assert_false(h_exited(r.worker, &st)); /* still alive */
    char status[64];
    snprintf(status, sizeof(status), "/proc/%d/status", (int)r.worker);
    FILE *f = fopen(status, "r");
    char line[256];
    long hwm = 0;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6)) hwm = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_stop_sampler(&r);
    /* The last job had the wrong width: check it is invalid_input, then
     * judge the others with the checker. */
    redisContext *c = redisConnect("127.0.0.1", f_redis_port);
    redisReply *rep = redisCommand(c, "GET %s%s", r.prefix, r.ids[199]);
    struct wire_result res;
    char err[256];
    assert_int_equal(wire_decode_result(rep->str, rep->len, &res, err, sizeof(err)), 0);
    assert_string_equal(res.code, "invalid_input");
    wire_result_fini(&res);
    freeReplyObject(rep);
    redisFree(c);
    r.n = 199;
    struct f_verdict v = f_check(&r, NULL);
    /* Dead letters carry no id of ours: count them on the DLQ directly. */
    rd_kafka_t *rd = h_reader(f_brokers, r.dlq);
    size_t dead = 0;
    double quiet = h_now() + 6;
    while (h_now() < quiet) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rd, 200);
        if (!m) continue;
        if (!m->err) dead++, quiet = h_now() + 2;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rd);
    rd_kafka_destroy(rd);
    fprintf(stderr, "FIGURES hostile-extra: hostile=%zu dead_lettered=%zu peak_rss_kb=%ld\n", nb,
            dead, hwm);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    /* Records with no usable id are dead-lettered; the NaN one has an id
     * and is answered invalid_input instead. */
    assert_true(dead >= nb - 1);
    f_run_fini(&r);
}

/* Soak: sustained load for 40 s; after a 10 s warm-up the worker's RSS and
 * open file descriptors stay flat. */
static void test_soak_flat(void **state)
{
    (void)state;
    struct f_run r;
    f_run_init(&r, "soak", 24000, NULL);
    f_start_sampler(&r);
    f_start_worker(&r);
    rd_kafka_t *p = h_producer(f_brokers);
    double t0 = h_now();
    long rss_warm = 0, fds_warm = 0, rss_end = 0, fds_end = 0;
    char path[64];
    for (size_t i = 0; i < r.n; i++) {
        f_produce_one(&r, p, i);
        /* 600 jobs/s for 40 s */
        double due = t0 + (double)(i + 1) / 600.0;
        while (h_now() < due) h_sleep_ms(1);
        if (!rss_warm && h_now() > t0 + 10) {
            snprintf(path, sizeof(path), "/proc/%d/status", (int)r.worker);
            FILE *f = fopen(path, "r");
            char line[256];
            while (f && fgets(line, sizeof(line), f))
                if (!strncmp(line, "VmRSS:", 6)) rss_warm = strtol(line + 6, NULL, 10);
            if (f) fclose(f);
            char cmd[64];
            snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)r.worker);
            FILE *pp = popen(cmd, "r");
            if (pp && fscanf(pp, "%ld", &fds_warm) != 1) fds_warm = -1;
            if (pp) pclose(pp);
        }
    }
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);
    assert_int_equal(f_wait_all(&r, 120), r.n);
    snprintf(path, sizeof(path), "/proc/%d/status", (int)r.worker);
    FILE *f = fopen(path, "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6)) rss_end = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)r.worker);
    FILE *pp = popen(cmd, "r");
    if (pp && fscanf(pp, "%ld", &fds_end) != 1) fds_end = -1;
    if (pp) pclose(pp);
    fprintf(stderr, "FIGURES soak-extra: seconds=%.0f rss_kb_warm=%ld rss_kb_end=%ld fds_warm=%ld "
            "fds_end=%ld\n", h_now() - t0, rss_warm, rss_end, fds_warm, fds_end);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    f_stop_sampler(&r);
    struct f_verdict v = f_check(&r, NULL);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_true(rss_warm > 0 && rss_end <= rss_warm + rss_warm / 4 + 8192);
    assert_true(fds_end <= fds_warm + 4);
    f_run_fini(&r);
}

static int setup(void **state)
{
    (void)state;
    f_make_model();
    char topics[2048];
    const char *const names[] = {"crash", "recover", "handover", "rdown", "rhole", "term", "hostile", "poison", "hang",
                                 "slow", "soak"};
    f_topics(topics, sizeof(topics), names, sizeof(names) / sizeof(names[0]));
    if (h_start_broker(f_kinfer_bin(), topics, F_PARTS, f_brokers, sizeof(f_brokers)) < 0)
        return -1;
    f_redis_port = h_free_port();
    redis_pid = start_redis_on(f_redis_port);
    if (redis_pid < 0) return -1;
    fprintf(stderr, "test_faults: broker %s, redis port %d, logs in %s\n", f_brokers,
            f_redis_port, h_dir());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kill(redis_pid, SIGCONT);
    h_kill_all();
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crash_kill9_repeatedly),
        cmocka_unit_test(test_kill9_recovery),
        cmocka_unit_test(test_scale_handover),
        cmocka_unit_test(test_redis_outage),
        cmocka_unit_test(test_redis_blackhole),
        cmocka_unit_test(test_sigterm_no_duplicates),
        cmocka_unit_test(test_poison_crash_loop),
        cmocka_unit_test(test_hung_executor_watchdog),
        cmocka_unit_test(test_slow_executor_no_eviction),
        cmocka_unit_test(test_hostile_input),
        cmocka_unit_test(test_soak_flat),
    };
    f_filter_tests(); /* KINFER_TEST_FILTER=test_poison* runs only those */
    return cmocka_run_group_tests(tests, setup, teardown);
}
