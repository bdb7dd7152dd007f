/* config_read.h - private to config/: the state of one cfg_load call and
 * what the readers of the file's settings share. config.c holds the
 * settings table and walks the file; config_kafka.c reads kafka.topics and
 * kafka.properties (with the librdkafka property guards); config_models.c
 * reads the model list. Not for use outside config/ (config.h is the API).
 *
 * Threads: main thread at startup only. Ownership: a loader borrows the
 * caller's path and error buffer; its c is the config being built. */
#ifndef KINFER_CONFIG_READ_H
#define KINFER_CONFIG_READ_H

#include <libconfig.h>
#include <stddef.h>

#include "config.h"

/* Where a setting's value came from, so an error found after reading (a
 * cross-field check) can still point at the line or the --set that set it.
 * All fields NULL/0: the table's default. */
struct origin {
    const char *file;  /* libconfig's copy; valid until config_destroy */
    unsigned line;
    const char *set;   /* the --set argument, borrowed from the caller */
};

struct loader {
    struct kcfg *c;
    const char *path;            /* the file cfg_load was given */
    char *err;
    size_t err_size;
    struct origin *orig;         /* one per row of the table, owned by cfg_load */
    const char *set_arg;         /* the --set being read by an aggregate's reader:
                                    its errors name it, not a file line */
};

/* libconfig's type codes in words, for "expected X, got Y" messages. */
const char *cfg_type_words(int type);

/* The path of a setting's file, as it works from the cwd: libconfig names
 * an @include'd file as written, relative to the main file's directory. */
void cfg_display_path(const struct loader *ld, const char *file, char *buf, size_t cap);

/* Record the first error in ld->err and return -1, so callers can `return
 * cfg_fail_...(...)`: at setting s ("FILE:LINE: message"); at wherever the
 * setting called name got its value ("FILE:LINE: name: message", "--set
 * ARG: message", or "FILE: name: message" for a default); or with no
 * place (out of memory, no file). */
int cfg_fail_at(struct loader *ld, const config_setting_t *s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cfg_fail_origin(struct loader *ld, const struct origin *o, const char *name,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int cfg_fail_plain(struct loader *ld, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The readers of the settings that hold more than one value (config.c's
 * aggregates[] lists them): each reads setting s into ld->c, or returns
 * -1 with the error recorded. */
int cfg_read_topics(struct loader *ld, const config_setting_t *s);     /* config_kafka.c */
int cfg_read_properties(struct loader *ld, const config_setting_t *s); /* config_kafka.c */
int cfg_read_models(struct loader *ld, const config_setting_t *s);     /* config_models.c */

/* Why a librdkafka property may not have this value (a sentence), or NULL
 * when it may: the properties kinfer's delivery guarantee rests on. */
const char *cfg_property_refusal(const char *key, const char *value);
/* Sets property key to value in ld->c's kafka.properties, replacing an
 * earlier value of the same key. Returns 0 or -1 (out of memory). */
int cfg_property_put(struct loader *ld, const char *key, const char *value);

#endif
