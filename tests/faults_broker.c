/* faults_broker.c - the Kafka-side rows of docs/reliability.md's fault table,
 * against real parts: a three-broker `kinfer broker` whose control channel
 * (its stdin/stdout) this program drives to break the cluster under a
 * running worker, a real redis-server, and the worker binary. It proves:
 *   broker outage   every broker down 12 s mid-load (the results' leader
 *                   first down and first up): nothing lost, the worker's
 *                   peak RSS bounded, and after the heal the committed
 *                   offsets reach the produced count (lag back to 0);
 *   produce errors  NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT and
 *                   NETWORK_EXCEPTION injected on Produce, and reply-topic
 *                   partition leaders moved, while jobs flow: nothing lost,
 *                   no duplicate replies (no worker restarts in this row);
 *   commit errors   REBALANCE_IN_PROGRESS and REQUEST_TIMED_OUT injected on
 *                   OffsetCommit: nothing lost, no committed offset rewinds;
 *   rebalance       up to three workers in one group joining, leaving
 *                   (SIGTERM) and dying (SIGKILL) under load: nothing lost,
 *                   no rewinds, no revoke past its budget; duplicates shown;
 *   slow broker     300 ms on every broker's responses for 10 s: nothing
 *                   lost.
 * Each row runs the checker it shares with faults_suite.c (lost, wrong,
 * duplicates, rewinds) and prints a FIGURES line on stderr; the runs, the
 * producers, the sampler and the checker live in faults.h, and this file
 * holds the broker's control channel, the measurements and the rows. The
 * outage and rebalance rows also catch a worker that stops fetching after its
 * assignment changed while backpressure had it paused: librdkafka keeps
 * a partition's pause across revoke and assign, so its jobs would sit in
 * Kafka, uncommitted, for as long as that worker lives (lost here means
 * "no result by the end of the row").
 *
 * What the mock cluster (librdkafka 2.0.2) cannot show: it dedupes
 * producer retries only for transactional producers, so a retry of a
 * Produce that had landed shows up twice on the reply topic where a real
 * broker would drop it; injected request errors never land, so the
 * produce-errors row proves the worker and librdkafka never publish twice
 * on their own, not that a real broker's dedupe works. The same gap is why
 * jobs are produced before any transport fault (a test producer's retry
 * across an outage would duplicate jobs). `make test-faults` runs it
 * (minutes); `make test` does not. */
#include <poll.h>

#include "faults.h"

#define N_BROKERS 3

/* The broker's control channel: we write its stdin, read its stdout. */
static int ctl_wfd = -1, ctl_rfd = -1;

/* ---- the broker and its control channel --------------------------------- */

/* Reads one line from fd into buf, waiting at most timeout_ms in all, so
 * a broker that stopped answering fails the test instead of hanging it.
 * Returns its length, or -1 on timeout or end of file. */
static int read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t n = 0;
    double until = h_now() + timeout_ms / 1000.0;
    while (n + 1 < cap) {
        int left = (int)((until - h_now()) * 1000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        char c;
        if (read(fd, &c, 1) != 1) break;
        if (c == '\n') {
            buf[n] = '\0';
            return (int)n;
        }
        buf[n++] = c;
    }
    buf[n] = '\0';
    return -1;
}

/* Starts `kinfer broker` with three brokers and pipes on its stdin and
 * stdout (h_start_broker hands out neither, and the control channel needs
 * both). The pid goes into h_children so h_kill_all ends it with the rest.
 * Fills f_brokers[] from the first line. Returns the pid or -1. */
static pid_t start_broker_ctl(const char *topics)
{
    int in[2], out[2];
    /* Close-on-exec: workers started later must not inherit our ends. */
    if (pipe2(in, O_CLOEXEC) < 0) return -1;
    if (pipe2(out, O_CLOEXEC) < 0) return -1;
    char log[300], nb[16], np[16];
    snprintf(log, sizeof(log), "%s/broker.log", h_dir());
    snprintf(nb, sizeof(nb), "%d", N_BROKERS);
    snprintf(np, sizeof(np), "%d", F_PARTS);
    char *argv[] = {(char *)f_kinfer_bin(), "broker", "--brokers", nb, "--partitions", np,
                    "--topics", (char *)topics, NULL};
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 2);
        dup2(in[0], 0);
        dup2(out[1], 1);
        execvp(argv[0], argv);
        perror(argv[0]);
        _exit(127);
    }
    setpgid(pid, pid);
    close(in[0]);
    close(out[1]);
    ctl_wfd = in[1];
    ctl_rfd = out[0];
    for (int i = 0; i < H_MAX_CHILDREN; i++)
        if (h_children[i] == 0) {
            h_children[i] = pid;
            break;
        }
    if (read_line(ctl_rfd, f_brokers, sizeof(f_brokers), 15000) <= 0) return -1;
    return pid;
}

/* Sends one control command and waits for its answer line. Returns 0 on
 * "ok"; anything else is printed and returns -1, so each fault a test
 * relies on is known to have been applied. */
__attribute__((format(printf, 1, 2))) static int ctl(const char *fmt, ...)
{
    char line[512], answer[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line) - 1) return -1;
    line[n++] = '\n';
    if (write(ctl_wfd, line, (size_t)n) != n) return -1;
    if (read_line(ctl_rfd, answer, sizeof(answer), 10000) < 0) {
        fprintf(stderr, "broker control: no answer to %.*s\n", n - 1, line);
        return -1;
    }
    if (strcmp(answer, "ok") != 0) {
        fprintf(stderr, "broker control: %.*s -> %s\n", n - 1, line, answer);
        return -1;
    }
    return 0;
}

/* ---- process and log measurements ----------------------------------------- */

/* A "Name:   N kB" field of /proc/<pid>/status in kB, or -1: VmHWM is the
 * peak resident set, the bound the outage row asserts. */
static long proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kb = -1;
    size_t flen = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
            kb = strtol(line + flen + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* How many lines of the run's worker logs (every member's) contain needle:
 * the rows report revokes, lost assignments and produce failures this way
 * instead of guessing them from timings. */
static int log_count(struct f_run *r, const char *needle)
{
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "cat %s/%s.*.log 2>/dev/null | grep -c -- '%s'", h_dir(), r->name,
             needle);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int n = -1;
    if (fscanf(p, "%d", &n) != 1) n = -1;
    pclose(p);
    return n;
}

/* SIGTERM to a worker; asserts it stopped cleanly (exit 0) within 30 s
 * and returns how long it took. */
static double stop_worker(pid_t pid)
{
    double t0 = h_now();
    assert_int_equal(h_stop(pid, SIGTERM, 30), 0);
    return h_now() - t0;
}

/* Records on the run's reply topic (the sum of its partitions' high
 * watermarks), or -1 when the cluster does not answer: tells the outage
 * row when the worker's in-flight results have been delivered. */
static long long reply_count(struct f_run *r)
{
    rd_kafka_t *p = h_producer(f_brokers);
    if (!p) return -1;
    long long sum = 0;
    for (int i = 0; i < F_PARTS && sum >= 0; i++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(p, r->reply, i, &lo, &hi, 2000) != 0) sum = -1;
        else sum += hi;
    }
    rd_kafka_destroy(p);
    return sum;
}

/* Prints each partition whose committed offset (the sampler's last
 * reading) is short of its end: where work stopped when a row fails. */
static void report_lag(struct f_run *r)
{
    rd_kafka_t *p = h_producer(f_brokers);
    if (!p) return;
    for (int i = 0; i < F_PARTS; i++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(p, r->topic, i, &lo, &hi, 5000) != 0) continue;
        if (r->last_committed[i] < hi)
            fprintf(stderr, "%s: partition %d committed %lld of %lld\n", r->name, i,
                    r->last_committed[i], (long long)hi);
    }
    rd_kafka_destroy(p);
}

/* ---- the tests -------------------------------------------------------------- */

/* Every broker down for 12 s mid-load, then up, as brokers fail and come
 * back one by one: the results' broker goes down 1.5 s before the others
 * and comes back first. The outage is longer than session.timeout.ms, so
 * the worker loses its assignment; it finishes its in-flight work while
 * it has none, then rejoins. Nothing may be lost, its peak RSS must stay
 * bounded while it cannot deliver, and after the heal the committed
 * offsets must reach what was produced (lag back to zero). */
static void test_broker_outage(void **state)
{
    (void)state;
    static struct f_run r; /* static: a failed assertion leaves its threads running */
    f_run_init(&r, "outage", 4000, NULL);
    /* Jobs led by broker 1, results by broker 2, the group by broker 3, so
     * the outage can start with the results' broker: deliveries stop
     * while fetching goes on, the worker fills up to its high mark and
     * pauses, and the full outage then finds it paused (the state a real
     * outage usually finds a loaded worker in). */
    for (int p = 0; p < F_PARTS; p++) {
        assert_int_equal(ctl("leader %s %d 1", r.topic, p), 0);
        assert_int_equal(ctl("leader %s %d 2", r.reply, p), 0);
    }
    assert_int_equal(ctl("coordinator %s 3", r.group), 0);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker(&r);
    size_t before = f_wait_results(&r, 300, 60);
    assert_true(before >= 300);
    assert_int_equal(ctl("down 2"), 0);
    h_sleep_ms(1500);
    assert_int_equal(ctl("down all"), 0);
    double t0 = h_now();
    long rss_max = 0;
    while (h_now() - t0 < 12) {
        long rss = proc_status_kb(r.worker, "VmRSS");
        if (rss > rss_max) rss_max = rss;
        h_sleep_ms(250);
    }
    size_t during = f_results_now(&r);
    /* The heal in the same order: the results' broker first, until every
     * result in Redis is also on the reply topic (the worker's in-flight
     * work is done while it has no assignment), then the rest, and the
     * worker rejoins. */
    assert_int_equal(ctl("up 2"), 0);
    double down_s = h_now() - t0;
    double t_up = h_now();
    while (reply_count(&r) < (long long)f_results_now(&r) && h_now() - t_up < 20) h_sleep_ms(200);
    double partial_s = h_now() - t_up;
    h_sleep_ms(1000);
    assert_int_equal(ctl("up all"), 0);
    size_t have = f_wait_all(&r, 75);
    double heal_s = h_now() - t_up;
    int st;
    assert_false(h_exited(r.worker, &st)); /* it rode the outage out */
    long hwm = proc_status_kb(r.worker, "VmHWM");
    fprintf(stderr, "outage: all brokers down %.1f s, the results' broker alone up %.1f s; "
            "results %zu before, %zu at the end of it, %zu of %zu %.1f s after; VmRSS max "
            "during %ld kB, VmHWM %ld kB\n", down_s, partial_s, before, during, have, r.n, heal_s,
            rss_max, hwm);
    /* Stop and check before asserting on have, so a stall still prints
     * its figures and the partitions it left behind. */
    double term_s = stop_worker(r.worker);
    f_stop_sampler(&r);
    if (have < r.n) report_lag(&r);
    long long committed = h_committed_sum(f_brokers, r.group, r.topic, F_PARTS);
    char extra[256];
    snprintf(extra, sizeof(extra),
             "down_s=%.1f all_results_after_heal_s=%.1f vmhwm_kb=%ld committed=%lld "
             "produced=%zu sigterm_exit_s=%.2f assignments_lost=%d",
             down_s, heal_s, hwm, committed, r.n, term_s, log_count(&r, "partitions_lost"));
    struct f_verdict v = f_check(&r, extra);
    assert_int_equal(have, r.n);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    assert_true(hwm > 0 && hwm < 512 * 1024);
    assert_int_equal(committed, (long long)r.n);
    f_run_fini(&r);
}

/* Produce requests fail while jobs flow: NOT_LEADER_OR_FOLLOWER,
 * REQUEST_TIMED_OUT and NETWORK_EXCEPTION injected in rounds, and the
 * reply topic's partition leaders moved between brokers. librdkafka's
 * idempotent producer retries them; the worker must neither lose a result
 * nor publish one twice (no worker restart here, so any duplicate is a
 * retry gone wrong). The mock never appends a request it fails, so this
 * cannot show a real broker's dedupe of a retry that had landed. */
static void test_produce_errors(void **state)
{
    (void)state;
    static struct f_run r; /* static: a failed assertion leaves its threads running */
    f_run_init(&r, "perr", 3000, NULL);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker(&r);
    size_t before = f_wait_results(&r, 100, 60);
    assert_true(before >= 100);
    /* NOT_LEADER_OR_FOLLOWER is code 6, which librdkafka 2.0.2 (and so the
     * control channel) names NOT_LEADER_FOR_PARTITION. */
    static const char *const codes[] = {"NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT",
                                        "NETWORK_EXCEPTION"};
    /* One error every 600 ms for about 8 s, a leader move every third
     * round. The worker is the only producer and sends a few requests a
     * second (one per leader, batched), so denser rounds fail every
     * request and nothing moves until they stop; this density lets jobs
     * flow between the errors. */
    int rounds = 0, injected = 0, moves = 0;
    double t0 = h_now(), ctl_max = 0;
    while (h_now() - t0 < 8) {
        const char *code = codes[rounds % 3];
        int count = 1;
        double c0 = h_now();
        assert_int_equal(ctl("error Produce %d %s", count, code), 0);
        injected += count;
        if (rounds % 3 == 2) {
            int part = rounds % F_PARTS;
            assert_int_equal(ctl("leader %s %d %d", r.reply, part, 1 + (rounds / 3) % N_BROKERS),
                             0);
            moves++;
        }
        if (h_now() - c0 > ctl_max) ctl_max = h_now() - c0;
        rounds++;
        h_sleep_ms(600);
    }
    double inject_s = h_now() - t0;
    size_t at_end = f_results_now(&r);
    size_t have = f_wait_all(&r, 120);
    fprintf(stderr, "perr: %d produce errors injected in %d rounds, %d leader moves over "
            "%.1f s (slowest control command %.2f s); results %zu when they started, %zu when "
            "they stopped\n", injected, rounds, moves, inject_s, ctl_max, before, at_end);
    assert_int_equal(have, r.n);
    /* Errors the worker did not use up would fail the next row's own
     * producer (which once left that row two partitions short). */
    assert_int_equal(ctl("clear Produce"), 0);
    double term_s = stop_worker(r.worker);
    f_stop_sampler(&r);
    char extra[256];
    snprintf(extra, sizeof(extra),
             "produce_errors_injected=%d leader_moves=%d worker_reproduced=%d "
             "sigterm_exit_s=%.2f",
             injected, moves, log_count(&r, "produce_failed"), term_s);
    struct f_verdict v = f_check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(v.dup_total, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    f_run_fini(&r);
}

/* OffsetCommit fails with REBALANCE_IN_PROGRESS and REQUEST_TIMED_OUT, in
 * rounds, while jobs flow. A failed commit leaves the stored offsets to
 * the next one; the committed offsets must never move back and nothing
 * may be lost. Once the errors stop the offsets must catch up. */
static void test_commit_errors(void **state)
{
    (void)state;
    static struct f_run r; /* static: a failed assertion leaves its threads running */
    f_run_init(&r, "cerr", 3000, NULL);
    f_produce_jobs(&r);
    f_start_sampler(&r);
    f_start_worker(&r);
    size_t before = f_wait_results(&r, 100, 60);
    assert_true(before >= 100);
    int injected = 0, rounds = 0;
    double t0 = h_now();
    while (h_now() - t0 < 8) {
        const char *code = rounds % 2 ? "REQUEST_TIMED_OUT" : "REBALANCE_IN_PROGRESS";
        assert_int_equal(ctl("error OffsetCommit 3 %s", code), 0);
        injected += 3;
        rounds++;
        h_sleep_ms(200);
    }
    size_t at_end = f_results_now(&r);
    size_t have = f_wait_all(&r, 120);
    fprintf(stderr, "cerr: %d commit errors injected in %d rounds over 8 s (%zu results "
            "when they stopped)\n", injected, rounds, at_end);
    assert_int_equal(have, r.n);
    assert_int_equal(ctl("clear OffsetCommit"), 0);
    /* Let the auto-commit (100 ms) use up any error still queued before
     * the shutdown commit. */
    h_sleep_ms(1500);
    double term_s = stop_worker(r.worker);
    f_stop_sampler(&r);
    long long committed = h_committed_sum(f_brokers, r.group, r.topic, F_PARTS);
    char extra[256];
    snprintf(extra, sizeof(extra),
             "commit_errors_injected=%d committed=%lld produced=%zu rebalances=%d "
             "sigterm_exit_s=%.2f",
             injected, committed, r.n, log_count(&r, "partitions_revoked"), term_s);
    struct f_verdict v = f_check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    assert_int_equal(committed, (long long)r.n);
    f_run_fini(&r);
}

/* Group membership churn under load: a backlog (so the first worker runs
 * paused at its high mark), then a steady stream; a second and a third
 * worker join, one leaves with SIGTERM, one is killed with SIGKILL (its
 * partitions come back after session.timeout.ms), a fourth joins. Every
 * job must get its result before the row ends, committed offsets never
 * rewind, every revoke finishes within its budget (no revoke_timeout
 * logged). Duplicates are reported, not bounded here: the killed
 * member's uncommitted work, and, on the mock only, the work since the
 * last auto-commit at each rebalance (the mock answers OffsetCommit with
 * REBALANCE_IN_PROGRESS while the group is joining, where a real broker
 * takes a current-generation commit during PreparingRebalance, so the
 * worker's revoke-time commit fails there). */
static void test_rebalance(void **state)
{
    (void)state;
    static struct f_run r; /* static: a failed assertion leaves its threads running */
    f_run_init(&r, "rebal", 3600, NULL);
    f_start_sampler(&r);
    f_produce_paced(&r, 800, 120);
    pid_t a = f_spawn_worker(&r, "a", NULL);
    assert_true(f_wait_results(&r, 200, 60) >= 200);
    pid_t b = f_spawn_worker(&r, "b", NULL);
    h_sleep_ms(4000);
    pid_t c = f_spawn_worker(&r, "c", NULL);
    h_sleep_ms(5000);
    size_t at_leave = f_results_now(&r);
    double leave_s = stop_worker(b);
    h_sleep_ms(3000);
    size_t at_kill = f_results_now(&r);
    assert_int_equal(h_stop(c, SIGKILL, 5), 128 + SIGKILL);
    h_sleep_ms(7000);
    pid_t d = f_spawn_worker(&r, "d", NULL);
    pthread_join(r.producer, NULL);
    assert_int_equal(atomic_load(&r.produced), r.n);
    size_t have = f_wait_all(&r, 45);
    fprintf(stderr, "rebal: b left (SIGTERM, %.2f s) at %zu results, c killed at %zu; "
            "%zu of %zu at the end\n", leave_s, at_leave, at_kill, have, r.n);
    /* Stop and check before asserting on have, so a stall still prints
     * its figures and the partitions it left behind. */
    double term_a = stop_worker(a), term_d = stop_worker(d);
    f_stop_sampler(&r);
    if (have < r.n) report_lag(&r);
    int revoke_timeouts = log_count(&r, "revoke_timeout");
    char extra[320];
    snprintf(extra, sizeof(extra),
             "members_max=3 assigned_events=%d revoked_events=%d lost_events=%d "
             "revoke_timeouts=%d sigterm_exit_s=%.2f,%.2f,%.2f",
             log_count(&r, "partitions_assigned"), log_count(&r, "partitions_revoked"),
             log_count(&r, "partitions_lost"), revoke_timeouts, leave_s, term_a, term_d);
    struct f_verdict v = f_check(&r, extra);
    assert_int_equal(have, r.n);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    assert_int_equal(revoke_timeouts, 0);
    f_run_fini(&r);
}

/* Every broker answers 300 ms late for 10 s while jobs stream in: the
 * worker slows down but loses nothing (a cheap row; no timing bound). */
static void test_slow_broker(void **state)
{
    (void)state;
    static struct f_run r; /* static: a failed assertion leaves its threads running */
    f_run_init(&r, "slow", 2000, NULL);
    f_start_sampler(&r);
    f_produce_paced(&r, 0, 200);
    f_start_worker(&r);
    assert_true(f_wait_results(&r, 200, 60) >= 200);
    assert_int_equal(ctl("rtt all 300"), 0);
    size_t at_slow = f_results_now(&r);
    h_sleep_ms(10000);
    size_t at_fast = f_results_now(&r);
    assert_int_equal(ctl("rtt all 0"), 0);
    pthread_join(r.producer, NULL);
    assert_int_equal(atomic_load(&r.produced), r.n);
    size_t have = f_wait_all(&r, 120);
    fprintf(stderr, "slow: %zu results in 10 s at 300 ms RTT (from %zu to %zu); %zu of %zu at "
            "the end\n", at_fast - at_slow, at_slow, at_fast, have, r.n);
    assert_int_equal(have, r.n);
    double term_s = stop_worker(r.worker);
    f_stop_sampler(&r);
    char extra[256];
    snprintf(extra, sizeof(extra), "rtt_ms=300 slow_s=10 results_while_slow=%zu "
             "rebalances=%d sigterm_exit_s=%.2f", at_fast - at_slow,
             log_count(&r, "partitions_revoked"), term_s);
    struct f_verdict v = f_check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    f_run_fini(&r);
}

/* Starts the three-broker cluster with every row's topics, and Redis. */
static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN); /* a dead broker fails ctl(), not the program */
    /* Several workers share the machine; outages make the sampler's
     * librdkafka noisy; duplicates are this program's subject. */
    f_worker_settings = "drain_timeout_ms = 5000; blas_threads = 1;";
    f_quiet_sampler = 1;
    f_list_duplicates = 1;
    f_make_model();
    char topics[1024];
    const char *const names[] = {"outage", "perr", "cerr", "rebal", "slow"};
    f_topics(topics, sizeof(topics), names, sizeof(names) / sizeof(names[0]));
    if (start_broker_ctl(topics) < 0) return -1;
    if (ctl("ping") < 0) return -1;
    if (h_start_redis(&f_redis_port) < 0) return -1;
    fprintf(stderr, "faults_broker: brokers %s, redis port %d, logs in %s\n", f_brokers,
            f_redis_port, h_dir());
    return 0;
}

/* Ends every child (broker, Redis, workers left by a failed assertion). */
static int teardown(void **state)
{
    (void)state;
    h_kill_all();
    return 0;
}

/* Runs the rows in order against one cluster and one Redis; each row
 * has topics and a group of its own. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broker_outage),
        cmocka_unit_test(test_produce_errors),
        cmocka_unit_test(test_commit_errors),
        cmocka_unit_test(test_rebalance),
        cmocka_unit_test(test_slow_broker),
    };
    f_filter_tests(); /* KINFER_TEST_FILTER=test_slow* runs only those */
    return cmocka_run_group_tests(tests, setup, teardown);
}
