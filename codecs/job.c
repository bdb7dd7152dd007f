/* job.c - lifecycle of the plain job struct. Any thread may call these on a
 * job it owns. */
#include "job.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct job *job_new(void)
{
    struct job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->model_idx = -1;
    j->priority = -1;
    return j;
}

void job_free(struct job *j)
{
    if (!j) return;
    free(j->input);
    free(j->meta);
    free(j->output);
    free(j->body);
    free(j->raw_key);
    free(j->raw_value);
    free(j);
}

void job_fail(struct job *j, enum proto_err e, const char *fmt, ...)
{
    j->err = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
    va_end(ap);
}
