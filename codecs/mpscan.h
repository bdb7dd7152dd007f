/* mpscan.h - structural pre-scan of untrusted MessagePack.
 *
 * msgpack-c allocates from declared array/map counts before the bytes
 * exist (5 bytes can reserve 16 GiB; docs/reliability.md, rule 9). mpscan walks
 * the headers of a buffer without allocating and says whether it is one
 * complete, well-formed object whose declared sizes fit in the bytes that
 * are really there, so that msgpack_unpack_next() can then run on it
 * safely. Threads: any; no state. */
#ifndef KINFER_MPSCAN_H
#define KINFER_MPSCAN_H

#include <stddef.h>

/* Deepest nesting mpscan_check() can track; a larger max_depth is clamped
 * to this. The walk keeps one counter per open container on the stack, so
 * this bounds its stack use (msgpack-c 4.0 itself stops at 32). */
#define MPSCAN_DEPTH_CAP 256

/* Checks that buf/len (borrowed) holds exactly one MessagePack object and
 * nothing after it, with no container nested deeper than max_depth (the
 * top-level container counts as depth 1; scalars add none), and with every
 * declared str/bin/ext length and every array/map count coverable by the
 * bytes that remain (each element needs at least one byte, each map entry
 * two, counted over all open containers together). Returns 0 if so, else
 * -1 with a one-line reason in errstr (may be NULL when errstr_size is 0). */
int mpscan_check(const void *buf, size_t len, int max_depth, char *errstr,
                 size_t errstr_size);

#endif
