/* cfgtab.h - a settings table engine, Redis-style: each setting that
 * holds one value is a row (dotted name, type, bounds, default, allowed
 * values, extra check, offset of its field in a plain struct, one line of
 * documentation), and this engine does what every row needs: defaults,
 * lookup by name, setting a value with its checks, freeing the strings.
 * Where values come from (a file, --set) and how an error is placed is
 * the caller's (config/config.c).
 *
 * Threads: any; no state. Ownership: rows are borrowed (static tables);
 * base is the caller's struct, whose string fields the engine owns from
 * cfgtab_defaults until cfgtab_free. */
#ifndef KINFER_CFGTAB_H
#define KINFER_CFGTAB_H

#include <stddef.h>

enum cfgtab_type {
    CFGTAB_INT,    /* an int field */
    CFGTAB_INT64,  /* an int64_t field */
    CFGTAB_STRING, /* a char * field, malloc'd */
    CFGTAB_BOOL,   /* an int field, 0 or 1 */
};

/* One row. Plain data. */
struct cfgtab_row {
    const char *name;           /* "batching.max_wait_ms", or "default_model" */
    enum cfgtab_type type;
    long long min, max;         /* value bounds (ints); length bounds (strings) */
    long long def_int;          /* default of an int setting */
    const char *def_str;        /* default of a string setting; NULL = computed */
    const char *const *choices; /* NULL-terminated allowed values, or NULL */
    /* Extra check of a string value: returns 0, or -1 with why filled. */
    int (*check)(const char *value, char *why, size_t why_size);
    size_t offset;              /* where the value lives in the struct */
    const char *doc;            /* one line, for humans */
};

/* What cfgtab_set_str returns when memory ran out (why says so). */
#define CFGTAB_ENOMEM (-2)

/* The row of rows[0..n) called name, or NULL. Borrows name. */
const struct cfgtab_row *cfgtab_find(const struct cfgtab_row *rows, size_t n,
                                     const char *name);

/* Row r's field in base (the struct the offsets are into). */
void *cfgtab_field(const struct cfgtab_row *r, void *base);

/* Sets every row's field in base to its default: ints to def_int,
 * strings to a copy of def_str (NULL ones are left alone). Returns 0, or
 * -1 when out of memory (what was copied is freed by cfgtab_free). */
int cfgtab_defaults(const struct cfgtab_row *rows, size_t n, void *base);

/* Stores v in row r's int field of base after the bounds check. Returns
 * 0, or -1 with why filled ("5 is out of range 1..4"). */
int cfgtab_set_int(const struct cfgtab_row *r, void *base, long long v, char *why,
                   size_t why_size);

/* Stores a copy of v (borrowed) in row r's string field of base after the
 * emptiness, choice, length and extra checks, freeing the value it
 * replaces. Returns 0; -1 with why filled when v is refused; or
 * CFGTAB_ENOMEM. */
int cfgtab_set_str(const struct cfgtab_row *r, void *base, const char *v, char *why,
                   size_t why_size);

/* Frees every string field of base that rows[0..n) name, and NULLs it. */
void cfgtab_free(const struct cfgtab_row *rows, size_t n, void *base);

#endif
