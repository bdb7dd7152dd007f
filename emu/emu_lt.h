/* emu_lt.h - the emulated cuBLASLt's own additions (the functions it
 * emulates are declared by CUDA's <cublasLt.h>, which emu/emu_lt.c
 * includes so that every signature is the real one).
 *
 * Never linked into the normal build: only emu's tests and the emulated
 * kinfer (make emu) link emu/emu_lt.o. Plain C. */
#ifndef KINFER_EMU_LT_H
#define KINFER_EMU_LT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A stream hook the emulated CUDA runtime provides (a weak symbol here):
 * when it is linked, cublasLtMatmul enqueues its work on the stream it is
 * given (in order, and recorded while the stream is capturing a graph) by
 * calling emu_rt_enqueue with fn and a copy of arg (arg_size bytes, freed
 * by the runtime); it returns 0, or a cudaError_t that cublasLtMatmul
 * answers CUBLAS_STATUS_EXECUTION_FAILED for. Without the runtime the
 * work runs at once on the calling thread. */
int emu_rt_enqueue(void *stream, void (*fn)(void *arg), const void *arg, size_t arg_size);

/* The number of cublasLtMatmul calls that ran (or were enqueued) since the
 * process started: lets a test tell that a GEMM went through cuBLASLt. */
unsigned long emu_lt_matmuls(void);

/* Makes the heuristic find no algorithm (NOT_SUPPORTED, no result) for
 * some shapes, as the real library may: none (the default), those with
 * m, n or k equal to 1, or all. Until it is called,
 * $KINFER_EMU_LT_REFUSE ("ones" or "all") chooses. Applies to the
 * heuristic calls that follow (a caller's cached algorithms stay). */
enum emu_lt_refusal { EMU_LT_REFUSE_NONE = 0, EMU_LT_REFUSE_ONES, EMU_LT_REFUSE_ALL };
void emu_lt_refuse(int which);

#ifdef __cplusplus
}
#endif

#endif
