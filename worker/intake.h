/* intake.h - the pipeline's first stage: owns the consumer. Each round it
 * takes finished jobs back (offsets), answers queued jobs whose deadline
 * passed, pauses or resumes fetching around the queue's high and low
 * marks, and polls one record: decodes it, routes it to its model and
 * queues it in the batcher, or answers it at once (invalid input, unknown
 * model, deadline already passed), or dead-letters it. It also answers
 * the group's rebalances (docs/reliability.md, rules 4 and 5).
 *
 * Admission (intake_admit: decode, route, tokenize, deadline) takes a
 * record's bytes, not a Kafka message, so it is tested without Kafka
 * (tests/test_admission.c).
 *
 * The intake never waits on the model or on Redis: when the queue is full
 * it takes no record until there is room (librdkafka keeps what it has
 * prefetched), and full for batching.pause_after_ms it pauses the
 * assigned partitions while polling goes on, so what it has taken in is
 * bounded by batching.max_queued_rows.
 *
 * Threads: the poll thread (the lifecycle's), which also runs the
 * rebalance callback inside rd_kafka_consumer_poll. Ownership: a record
 * becomes a job owned by the batcher (queued) or the sink's queue
 * (answered); finished jobs come back through the offsets and are freed
 * here. */
#ifndef KINFER_INTAKE_H
#define KINFER_INTAKE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../batching/batcher.h"
#include "../gpu/model.h"
#include "../telemetry/stats.h"
#include "../config/config.h"
#include "genexec.h"
#include "jobq.h"
#include "offsets.h"
#include "ranges.h"
#include "worker.h"

struct intake_conf {
    const struct kcfg *cfg;        /* borrowed; outlives the stage */
    const struct worker_opts *opts;/* group, priority, rate, deadlines */
    struct model *const *models;   /* by model index, borrowed; NULL for a generator */
    struct genmodel *const *gens;  /* by model index: the generators (NULL entries for the
                                      others); NULL = none */
    struct genexec *genexec;       /* where admitted generation jobs go */
    size_t n_models;
    int default_model;             /* for jobs that name none */
    int model_override;            /* every job runs on this model; -1 = as asked */
    struct batcher *batcher;       /* where routed jobs queue */
    struct jobq *sink;             /* where early answers and dead letters go */
    struct offsets *offsets;       /* every record taken is tracked there */
    struct ranges *ranges;         /* bounded ranges (assign mode); NULL = the group */
    struct stats *stats;
    atomic_int *fatal;             /* set when the process must stop */
    size_t max_record_bytes;       /* a dead letter's bytes are cut to this */
    /* Rows the executors took off jobs that ran (exec.h, `lightened`):
     * the intake takes them off its in-flight count as it collects. */
    atomic_size_t *lightened;
};

struct intake;

/* Makes the consumer and subscribes to kafka.topics (or assigns the
 * ranges). Returns the stage, or NULL with errstr filled. */
struct intake *intake_new(const struct intake_conf *c, char *errstr, size_t errstr_size);

/* The stage without a consumer: only intake_admit, the in-flight count
 * and intake_destroy may be used on it (tests/test_admission.c). */
struct intake *intake_new_offline(const struct intake_conf *c, char *errstr,
                                  size_t errstr_size);

/* A consumed record, as admission reads it; every pointer is borrowed for
 * the call. */
struct intake_record {
    const char *topic;
    int32_t partition;
    int64_t offset;
    const void *key;
    size_t key_len;
    const void *value;
    size_t value_len;
    const char *content_type; /* the content-type header, NUL-terminated; NULL: none */
    int64_t timestamp_ms;     /* the record's timestamp; < 0: none (the wall clock stands in) */
};

/* Where admission put a record's job. */
enum intake_admitted {
    INTAKE_QUEUED,   /* decoded, routed, tokenized: queued in the batcher */
    INTAKE_ANSWERED, /* failed (invalid input, unknown model, deadline passed...):
                        its error result encoded and queued in the sink */
    INTAKE_DEAD,     /* not a job at all: a dead letter queued in the sink */
    INTAKE_FATAL,    /* out of memory: *fatal set, nothing queued */
};

/* Admission, what the poll loop does with each record it takes: decodes
 * it, routes it to its model, tokenizes an encoder's rows, settles its
 * deadline, tracks its offset, and queues the job where the answer says
 * (the job then belongs to the batcher or the sink's queue). Needs no
 * Kafka handle. */
enum intake_admitted intake_admit(struct intake *in, const struct intake_record *r);

/* One round of the poll loop (see above); waits in the consumer at most
 * 20 ms, less when a queued deadline is nearer. */
void intake_poll(struct intake *in);

/* Takes finished jobs back: their offsets are stored, their rows leave
 * the in-flight count. */
void intake_collect(struct intake *in);

/* After a stop request: stops fetching and taking records, closes the
 * batcher so everything queued runs, and keeps serving the group while
 * what was taken in finishes, for at most timeout_ms (or until *fatal).
 * Returns the number of jobs left unfinished (their offsets stay
 * uncommitted: the next owner runs them). */
size_t intake_drain(struct intake *in, int timeout_ms);

/* Records taken and not finished. */
size_t intake_pending(const struct intake *in);

/* The executors and the sink have stopped: nothing more can finish, so a
 * rebalance from now on commits without waiting. */
void intake_pipeline_stopped(struct intake *in);

/* Whether the bounded ranges are all done (never, without ranges). */
int intake_ranges_done(struct intake *in);

/* Commits and closes the consumer (leaving the group), all by deadline_us
 * (clock_mono_us): a coordinator that does not answer cannot hold the
 * stop past it. Returns 0 when closed, -1 when given up (logged; the
 * consumer is then destroyed without a close, the group drops the member
 * at its session timeout, and what was not committed runs again). */
int intake_close(struct intake *in, int64_t deadline_us);

/* Frees in and its consumer. Accepts NULL. */
void intake_destroy(struct intake *in);

/* For the gauges: rows taken in and not finished, partitions assigned,
 * and whether fetching is paused. */
size_t intake_inflight_rows(const struct intake *in);
int intake_assigned(const struct intake *in);
/* 1 once the consumer holds a group member id (it joined its group). */
int intake_has_member(struct intake *in);
int intake_paused(const struct intake *in);

#endif
