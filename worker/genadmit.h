/* genadmit.h - admission of a generation job (worker/intake.c calls it
 * once the job's model is known): the job and the model must both be of
 * generation (a `prompt`/`messages` job to an encoder or an MLP, or an
 * encoder's job to a generating model, is invalid_input saying which);
 * the prompt is tokenized (genmodel.h: `prompt` with the tokenizer's
 * specials, `messages` through the chat template); it must leave room
 * for one generated token in the context; max_tokens defaults to
 * generation.max_tokens and is capped by the context; the most bytes the
 * result can take must fit what the producer can publish.
 *
 * Weight: the job counts prompt + max_tokens tokens against the
 * worker's in-flight bound (job->weight, in the same units as rows), so
 * a backlog of generation jobs holds at most about
 * 2 x batching.max_queued_rows tokens of prompts and outputs in memory.
 *
 * Threads: the poll thread. Ownership: the job is borrowed; the prompt's
 * ids become the job's (ids, n_tokens). */
#ifndef KINFER_GENADMIT_H
#define KINFER_GENADMIT_H

#include <stddef.h>

#include "../batching/job.h"
#include "../config/config.h"
#include "../gen/genmodel.h"

/* gm is the job's model's generator (NULL: not a generating model).
 * *scratch is the caller's tokenizer scratch, made on first use. Returns
 * 0 when j is ready for the generator (gen_max_tokens, ids, n_tokens,
 * weight set); -1 with j failed (job_fail) to be answered; -2 when out
 * of memory (j failed too). */
int genadmit(const struct genmodel *gm, struct tokenizer_scratch **scratch,
             const struct kcfg *cfg, size_t max_record_bytes, struct job *j);

#endif
