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

const char *job_err_name(enum job_err e)
{
    switch (e) {
    case JOB_OK: return "ok";
    case JOB_ERR_INVALID_INPUT: return "invalid_input";
    case JOB_ERR_UNKNOWN_MODEL: return "unknown_model";
    case JOB_ERR_DEADLINE_EXCEEDED: return "deadline_exceeded";
    case JOB_ERR_INFERENCE_FAILED: return "inference_failed";
    case JOB_ERR_SHUTTING_DOWN: return "shutting_down";
    }
    return "inference_failed";
}

void job_fail(struct job *j, enum job_err e, const char *fmt, ...)
{
    j->err = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
    va_end(ap);
}

int job_id_valid(const char *s, size_t len)
{
    if (len < 1 || len > JOB_ID_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                 (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
                 c == '@' || c == '/' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}
