/* flow.c - the backpressure decision (see flow.h). Hysteresis between the
 * high mark and half of it keeps pause/resume from flapping at one mark.
 *
 * Threads: the poll thread. */
#include "flow.h"

int flow_should_pause(const struct flow_marks *m, int paused, size_t queued_rows,
                      size_t taken_rows)
{
    if (queued_rows >= m->queued_high || taken_rows >= m->taken_high) return 1;
    if (paused && (queued_rows > m->queued_high / 2 || taken_rows > m->taken_high / 2))
        return 1;
    return 0;
}
