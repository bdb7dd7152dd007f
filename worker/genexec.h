/* genexec.h - the generator stage: the executor of generation jobs. A
 * generator thread (a lane; one per device, so the CUDA backend's GPUs
 * each generate, with the copy of the weights on that device) owns a
 * generation engine (gen/engine.h) per generating model, each with its
 * own key/value cache (generation.kv_cache_mb, blocks of
 * generation.block_tokens, generation.max_seqs sequences, at most
 * batching.max_batch_tokens new tokens a step). The intake hands the
 * stage each admitted generation job (its prompt already tokenized),
 * which goes to the lane holding the fewest jobs (idle lanes take
 * turns); the lane submits it to its model's engine, steps the engines
 * while any has work, and as each job finishes encodes its result and
 * pushes it to the sink's queue as a batch of one, so its offset is
 * committed only after Redis and the reply topic acknowledged it.
 *
 * Before a job is submitted its attempt counter goes up in Redis (when
 * worker.max_attempts is set): a job counted more than max_attempts
 * times (the worker died generating it each time) is answered
 * inference_failed instead (docs/reliability.md, rule 10).
 *
 * Streaming (a job's stream: true): entries are appended to the Redis
 * stream <redis.stream_prefix><id> - start = 1 when it is submitted, text
 * = each settled piece, done = 1 with finish_reason - each expiring with
 * redis.ttl_ms. A Redis failure stops that job's stream (logged) but not
 * the job: its result still goes through the sink.
 *
 * A decoder that failed for good (MODEL_EFATAL) sets *fatal: the worker
 * exits 2 and the jobs it held, unanswered and uncommitted, run again
 * after the restart. At stop, jobs still generating or waiting are
 * dropped the same way (uncommitted: the next owner runs them).
 *
 * Memory: each engine's waiting queue holds at most 2 x max_seqs + 8
 * requests, its batch max_seqs; the lanes' own queues and the jobs their
 * engines had no room for yet hold what the intake admitted, which the
 * intake's in-flight bound limits (each job weighs its prompt plus
 * max_tokens tokens: genadmit.h). A cache of kv_cache_mb per model on
 * each device.
 *
 * Threads: genexec_start and genexec_stop on the lifecycle's thread;
 * genexec_push from the poll thread (never blocks); the generator thread;
 * the gauges from any thread. Ownership: a pushed job is the stage's
 * until it is pushed to the sink (or dropped at stop / on a fatal error). */
#ifndef KINFER_GENEXEC_H
#define KINFER_GENEXEC_H

#include <stdatomic.h>
#include <stddef.h>

#include "../batching/job.h"
#include "../config/config.h"
#include "../gen/genmodel.h"
#include "../telemetry/stats.h"
#include "jobq.h"

struct genexec_conf {
    const struct kcfg *cfg;           /* borrowed; outlives the stage */
    struct genmodel *const *gens;     /* by model index; NULL = not a generator */
    size_t n_models;
    struct jobq *out;                 /* the sink's queue */
    struct stats *stats;
    atomic_int *fatal;
    int count_attempts;               /* attempt counters in Redis (rule 10) */
    int stream;                       /* 0: no Redis (streaming off) */
    size_t lanes;                     /* generator threads, one per device (0: one) */
};

#define GENEXEC_MAX_LANES 16

struct genexec;

/* Starts the lanes, each making every generating model's engine on its
 * thread (lane i on executor slot i, so on device i). NULL with errstr
 * filled (an engine that cannot be made: a cache budget that holds no
 * block, out of memory). With no generating model it returns a stage
 * with no thread. */
struct genexec *genexec_start(const struct genexec_conf *c, char *errstr, size_t errstr_size);

/* Hands j (a generation job of a generating model) to the stage. */
void genexec_push(struct genexec *g, struct job *j);

/* Gauges: sequences generating, requests waiting (in the engines and the
 * stage's queue), KV cache blocks used and total, preemptions. */
struct genexec_gauges {
    size_t running, waiting, blocks_used, blocks_total;
    uint64_t preemptions, shared_tokens;
};
void genexec_gauges(struct genexec *g, struct genexec_gauges *out);

/* Cuts short its Redis calls (stream, attempt counters). Any thread. */
void genexec_cut(struct genexec *g);

/* Stops the thread and frees g; jobs it still holds are freed unanswered
 * (uncommitted). Accepts NULL. */
void genexec_stop(struct genexec *g);

#endif
