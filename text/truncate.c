/* truncate.c - the pair truncation rule (truncate.h).
 *
 * Threads: any; no state. */
#include "truncate.h"

void trunc_longest_first(size_t *na, size_t *nb, size_t ja, size_t jb, size_t max)
{
    size_t n1 = ja, n2 = jb;
    int swap = n1 > n2;
    if (swap) {
        size_t x = n1;
        n1 = n2;
        n2 = x;
    }
    if (n1 > max) n2 = n1;
    else n2 = n1 > max - n1 ? n1 : max - n1;
    if (n1 + n2 > max) {
        n1 = max / 2;
        n2 = n1 + max % 2;
    }
    if (swap) {
        size_t x = n1;
        n1 = n2;
        n2 = x;
    }
    if (n1 < *na) *na = n1;
    if (n2 < *nb) *nb = n2;
}
