/* cfgtab.c - the settings table engine (see cfgtab.h): defaults, lookup,
 * checked stores and freeing, all driven by the rows, so a new setting is
 * a new row and no code.
 *
 * Threads: any; no state. Ownership: the string fields of base hold
 * malloc'd copies, replaced and freed here. */
#include "cfgtab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every field is reached through its row's offset. */
void *cfgtab_field(const struct cfgtab_row *r, void *base)
{
    return (char *)base + r->offset;
}

const struct cfgtab_row *cfgtab_find(const struct cfgtab_row *rows, size_t n,
                                     const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].name, name) == 0) return &rows[i];
    return NULL;
}

int cfgtab_defaults(const struct cfgtab_row *rows, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        const struct cfgtab_row *r = &rows[i];
        if (r->type == CFGTAB_INT || r->type == CFGTAB_BOOL) {
            *(int *)cfgtab_field(r, base) = (int)r->def_int;
        } else if (r->type == CFGTAB_INT64) {
            *(int64_t *)cfgtab_field(r, base) = r->def_int;
        } else if (r->def_str) {
            char *s = strdup(r->def_str);
            if (!s) return -1;
            *(char **)cfgtab_field(r, base) = s;
        }
    }
    return 0;
}

int cfgtab_set_int(const struct cfgtab_row *r, void *base, long long v, char *why,
                   size_t why_size)
{
    if (v < r->min || v > r->max) {
        snprintf(why, why_size, "%lld is out of range %lld..%lld", v, r->min, r->max);
        return -1;
    }
    if (r->type == CFGTAB_INT || r->type == CFGTAB_BOOL)
        *(int *)cfgtab_field(r, base) = (int)v;
    else
        *(int64_t *)cfgtab_field(r, base) = (int64_t)v;
    return 0;
}

int cfgtab_set_str(const struct cfgtab_row *r, void *base, const char *v, char *why,
                   size_t why_size)
{
    size_t len = strlen(v);
    if (len == 0 && r->min > 0) {
        snprintf(why, why_size, "must not be empty");
        return -1;
    }
    if (r->choices) {
        const char *const *ch = r->choices;
        while (*ch && strcmp(*ch, v) != 0) ch++;
        if (!*ch) {
            char list[256] = "";
            size_t used = 0;
            for (ch = r->choices; *ch && used < sizeof(list); ch++) {
                int n = snprintf(list + used, sizeof(list) - used, "%s%s",
                                 ch == r->choices ? "" : ", ", *ch);
                if (n < 0) break;
                used += (size_t)n;
            }
            snprintf(why, why_size, "'%s' is not one of %s", v, list);
            return -1;
        }
    }
    if ((long long)len < r->min || (long long)len > r->max) {
        snprintf(why, why_size, "'%s' must be %lld..%lld characters long", v, r->min, r->max);
        return -1;
    }
    if (r->check) {
        char check_why[256];
        if (r->check(v, check_why, sizeof(check_why)) < 0) {
            snprintf(why, why_size, "%s", check_why);
            return -1;
        }
    }
    char *copy = strdup(v);
    if (!copy) {
        snprintf(why, why_size, "out of memory");
        return CFGTAB_ENOMEM;
    }
    char **slot = cfgtab_field(r, base);
    free(*slot);
    *slot = copy;
    return 0;
}

void cfgtab_free(const struct cfgtab_row *rows, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        if (rows[i].type != CFGTAB_STRING) continue;
        char **slot = cfgtab_field(&rows[i], base);
        free(*slot);
        *slot = NULL;
    }
}
