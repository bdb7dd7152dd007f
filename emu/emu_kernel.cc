// emu_kernel.cc - the scheduler behind emu_kernel.h: a launch becomes one
// record on its stream (emu_rt.c runs it now or keeps it in a graph);
// running it runs the grid's blocks one by one in a shuffled order, and a
// block's threads as contexts of their own on the running host thread. The
// scheduler runs every runnable thread once, in a fresh shuffled order,
// until each has finished or waits (at __syncthreads or a shuffle); then
// it releases a warp whose named lanes all wait at a shuffle, or else the
// block when all its live threads wait at __syncthreads. Nothing to
// release while threads still wait is a hung kernel: the launch fails
// with cudaErrorLaunchFailure (sticky), as a device's watchdog would end
// it.
//
// Contexts: a kernel thread runs on a stack of its own; a round passes
// from each thread straight to the next (the last back to the
// scheduler), and a switch saves and restores only the callee-saved
// registers and the stack pointer: on x86-64 by the few instructions
// below, with no system call (ucontext's swapcontext sets the signal mask
// each time); elsewhere by ucontext. The SSE and x87 control words, which
// a call also preserves, are the host thread's: kernels never change them
// (no rounding mode, no exception mask), so every thread runs under the
// launching thread's. Starting a thread is writing its first frame.
//
// Threads: each host thread has its own scheduler state (thread_local);
// the stacks are made once per host thread and kept.
#include "emu_kernel.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
// The hand-written switch returns on another stack than it was called
// on, which a shadow stack (CET) would refuse: such builds use ucontext.
#if defined(__x86_64__) && !(defined(__CET__) && (__CET__ & 2))
#define EMU_FAST_SWITCH 1
#else
#include <ucontext.h>
#endif

#include <vector>

#include "emu_rt.h"

// AddressSanitizer is told of every switch between stacks (the
// scheduler's, the kernel threads'), so that it checks each frame on its
// own stack and a kernel's out-of-bounds access is reported as such;
// nothing in a build without it.
#if defined(__SANITIZE_ADDRESS__)
#include <pthread.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ASAN_LEAVE(fake, bottom, size) __sanitizer_start_switch_fiber(fake, bottom, size)
#define ASAN_ARRIVE(fake) __sanitizer_finish_switch_fiber(fake, nullptr, nullptr)
#define ASAN_FRESH(stack, size) ASAN_UNPOISON_MEMORY_REGION(stack, size)
#else
#define ASAN_LEAVE(fake, bottom, size) ((void)(fake), (void)(bottom), (void)(size))
#define ASAN_ARRIVE(fake) ((void)(fake))
#define ASAN_FRESH(stack, size) ((void)(stack), (void)(size))
#endif

thread_local uint3 emu_threadIdx, emu_blockIdx;
thread_local dim3 emu_blockDim, emu_gridDim;

// A kernel thread's first frame calls this; it never returns.
extern "C" void emu_fiber_main(void) __attribute__((noreturn, visibility("hidden")));

namespace {

constexpr size_t kStack = 64 << 10;

#ifdef EMU_FAST_SWITCH
// A context is the stack pointer it was left at; the registers lie on
// that stack, pushed by ctx_switch.
struct ctx {
    void *sp;
    const void *bottom; // its stack, for AddressSanitizer
    size_t size;
};
extern "C" void emu_ctx_switch(void **save, void *to) __attribute__((visibility("hidden")));
extern "C" void emu_ctx_start(void) __attribute__((visibility("hidden")));
asm(R"(
        .text
        .p2align 4
        .globl emu_ctx_switch
        .hidden emu_ctx_switch
        .type emu_ctx_switch, @function
emu_ctx_switch:
        pushq %rbp
        pushq %rbx
        pushq %r12
        pushq %r13
        pushq %r14
        pushq %r15
        movq %rsp, (%rdi)
        movq %rsi, %rsp
        popq %r15
        popq %r14
        popq %r13
        popq %r12
        popq %rbx
        popq %rbp
        ret
        .size emu_ctx_switch, .-emu_ctx_switch
        .globl emu_ctx_start
        .hidden emu_ctx_start
        .type emu_ctx_start, @function
emu_ctx_start:
        call emu_fiber_main
        ud2
        .size emu_ctx_start, .-emu_ctx_start
)");

// A fresh context on stack: ctx_switch to it pops zeroed registers, then
// returns into emu_ctx_start with the stack 16-byte aligned (as a call
// expects it).
void ctx_init(ctx &c, char *stack, size_t size)
{
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 72);
    for (int i = 0; i < 6; i++) sp[i] = 0;
    sp[6] = (uint64_t)(uintptr_t)&emu_ctx_start;
    sp[7] = 0;
    sp[8] = 0;
    c.sp = sp;
    c.bottom = stack;
    c.size = size;
    ASAN_FRESH(stack, size); // what a thread that never returned left poisoned
}

inline void ctx_switch(ctx &from, ctx &to)
{
    void *fake = nullptr;
    ASAN_LEAVE(&fake, to.bottom, to.size);
    emu_ctx_switch(&from.sp, to.sp);
    ASAN_ARRIVE(fake);
}

// Leaves the running context for good (a finished or faulted thread).
[[noreturn]] void ctx_jump(ctx &to)
{
    void *gone;
    ASAN_LEAVE(nullptr, to.bottom, to.size);
    emu_ctx_switch(&gone, to.sp);
    __builtin_unreachable();
}
#else
struct ctx {
    ucontext_t uc;
    const void *bottom; // its stack, for AddressSanitizer
    size_t size;
};

// Apart from run_block: getcontext returns twice.
__attribute__((noinline)) void ctx_init(ctx &c, char *stack, size_t size)
{
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, emu_fiber_main, 0);
    c.bottom = stack;
    c.size = size;
    ASAN_FRESH(stack, size);
}

inline void ctx_switch(ctx &from, ctx &to)
{
    void *fake = nullptr;
    ASAN_LEAVE(&fake, to.bottom, to.size);
    swapcontext(&from.uc, &to.uc);
    ASAN_ARRIVE(fake);
}

[[noreturn]] void ctx_jump(ctx &to)
{
    ASAN_LEAVE(nullptr, to.bottom, to.size);
    setcontext(&to.uc);
    abort();
}
#endif

enum state { READY, SYNC, WARP, DONE };

struct fiber {
    ctx c;
    state st;
    bool started;
    unsigned mask;   // the shuffle it waits at
    int src;         // the lane it reads there
    uint64_t posted; // the value it posted there, then the one it reads
    uint3 tid;
};

struct block_run {
    std::vector<fiber> f;
    std::vector<int> order; // this round's threads
    size_t pos;             // the running one's place in order
    ctx sched;
    int cur;
    bool bad;            // a lane shuffled outside its own mask
    volatile bool fault; // a thread touched memory it may not (SIGSEGV, SIGBUS)
    void (*fn)(void *);
    void *arg;
};

struct stacks {
    std::vector<char *> s;
    ~stacks()
    {
        for (char *p : s) free(p);
    }
};

thread_local block_run *B;
thread_local stacks S;
thread_local uint64_t rng = 0x9e3779b97f4a7c15ull;

uint64_t next()
{
    uint64_t x = rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

template <typename T>
void shuffle(std::vector<T> &v)
{
    size_t i = v.size();
    // An index below i from the high half of r * i, r a random 32 bits
    // (two of them from each draw) where i fits 32 bits: no division.
    for (; i > 1 && (i >> 32); i--)
        std::swap(v[i - 1], v[(size_t)(((unsigned __int128)next() * i) >> 64)]);
    for (; i > 2; i -= 2) {
        uint64_t r = next();
        std::swap(v[i - 1], v[(size_t)(((r >> 32) * i) >> 32)]);
        std::swap(v[i - 2], v[(size_t)(((r & 0xffffffffu) * (i - 1)) >> 32)]);
    }
    if (i == 2) std::swap(v[1], v[(size_t)(next() >> 63)]);
}

// Leaves the running thread (saving it in save; NULL when it is over)
// for the next of the round, or the scheduler after the last: one switch
// per thread, and between threads at the same point of the same code
// the processor's return predictions stay right.
void pass(ctx *save)
{
    block_run &b = *B;
    ctx *to = &b.sched;
    if (++b.pos < b.order.size()) {
        int i = b.order[b.pos];
        fiber &f = b.f[(size_t)i];
        if (!f.started) {
            // Each stack's top a cache line further than the last's (64
            // apart): the threads' frames do not all fall in the same
            // cache sets.
            ctx_init(f.c, S.s[(size_t)i], kStack - (size_t)(i % 64) * 64);
            f.started = true;
        }
        b.cur = i;
        emu_threadIdx = f.tid;
        to = &f.c;
    } else {
        b.cur = -1;
    }
    if (save)
        ctx_switch(*save, *to);
    else
        ctx_jump(*to);
}

void yield(state s)
{
    fiber &me = B->f[(size_t)B->cur];
    me.st = s;
    pass(&me.c);
}

// A kernel thread's SIGSEGV or SIGBUS is the device's illegal address:
// the thread ends there and the block with it. Elsewhere the signal
// does what it did before.
struct sigaction old_segv, old_bus;
thread_local char *alt_stack;

void on_fault(int sig, siginfo_t *si, void *uc)
{
    if (B && B->cur >= 0) {
        B->fault = true;
        B->f[(size_t)B->cur].st = DONE;
        ctx_jump(B->sched);
    }
    // Not a kernel's: the handler that was there before ours.
    const struct sigaction &old = sig == SIGSEGV ? old_segv : old_bus;
    if (old.sa_flags & SA_SIGINFO) {
        old.sa_sigaction(sig, si, uc);
    } else if (old.sa_handler == SIG_IGN) {
        return;
    } else if (old.sa_handler != SIG_DFL) {
        old.sa_handler(sig);
    } else {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

// Puts on_fault in place (again, if a test framework replaced it since),
// keeping the handler it replaces for faults outside kernels.
void fault_handlers()
{
    if (!alt_stack && (alt_stack = (char *)malloc(SIGSTKSZ * 4))) {
        stack_t st = {};
        st.ss_sp = alt_stack;
        st.ss_size = SIGSTKSZ * 4;
        sigaltstack(&st, nullptr);
    }
    const int sigs[2] = {SIGSEGV, SIGBUS};
    for (int sig : sigs) {
        struct sigaction cur = {};
        sigaction(sig, nullptr, &cur);
        if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault) continue;
        struct sigaction sa = {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, sig == SIGSEGV ? &old_segv : &old_bus);
    }
}

// Releases what can go on into b.order (in index order); 0 when nothing
// can (all done, or hung: -1).
int release(block_run &b)
{
    int n = (int)b.f.size(), live = 0, at_sync = 0, released = 0;
    if (b.bad || b.fault) return -1;
    for (int w = 0; w < n; w += 32) {
        unsigned waiting = 0, done = 0, mask = 0;
        int lanes = n - w < 32 ? n - w : 32;
        for (int l = 0; l < lanes; l++) {
            const fiber &f = b.f[w + l];
            if (f.st == WARP) {
                if (waiting && f.mask != mask) return -1; // lanes at different shuffles
                mask = f.mask;
                waiting |= 1u << l;
            }
            if (f.st == DONE) done |= 1u << l;
        }
        if (!waiting) continue;
        unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        if ((mask & ~present) || (mask & done)) return -1; // a named lane is absent or gone
        if ((mask & waiting) == mask) {
            // The exchange, while every named lane waits: each reads the
            // value its source lane posted (its own when the source is
            // outside the mask or the warp).
            uint64_t posted[32];
            for (int l = 0; l < lanes; l++) posted[l] = b.f[w + l].posted;
            for (int l = 0; l < lanes; l++) {
                if (!(waiting & (1u << l))) continue;
                fiber &f = b.f[w + l];
                int src = f.src;
                if (src >= 0 && src < lanes && (mask & (1u << src))) f.posted = posted[src];
                f.st = READY;
                b.order.push_back(w + l);
            }
            released = 1;
        }
    }
    if (released) return 1;
    for (fiber &f : b.f) {
        live += f.st != DONE;
        at_sync += f.st == SYNC;
    }
    if (!live) return 0;
    if (at_sync != live) return -1;
    for (int i = 0; i < n; i++)
        if (b.f[(size_t)i].st == SYNC) {
            b.f[(size_t)i].st = READY;
            b.order.push_back(i);
        }
    return 1;
}

// Runs one block: 0, or the cudaError_t that ended it (a hang, a fault).
cudaError_t run_block(dim3 bd, void (*fn)(void *), void *arg)
{
    int n = (int)(bd.x * bd.y * bd.z);
    block_run b;
    b.f.resize((size_t)n);
    b.cur = -1;
    b.bad = false;
    b.fault = false;
    b.fn = fn;
    b.arg = arg;
    while (S.s.size() < (size_t)n) {
        char *p = (char *)malloc(kStack);
        if (!p) return cudaErrorMemoryAllocation;
        S.s.push_back(p);
    }
    std::vector<int> &order = b.order;
    order.reserve((size_t)n);
    int i = 0;
    for (unsigned z = 0; z < bd.z; z++)
        for (unsigned y = 0; y < bd.y; y++)
            for (unsigned x = 0; x < bd.x; x++, i++) {
                fiber &f = b.f[(size_t)i];
                f.st = READY;
                f.started = false;
                f.tid = make_uint3(x, y, z);
                order.push_back(i);
            }
#if defined(__SANITIZE_ADDRESS__)
    // The scheduler's stack is this host thread's.
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *addr = nullptr;
        size_t size = 0;
        pthread_attr_getstack(&attr, &addr, &size);
        b.sched.bottom = addr;
        b.sched.size = size;
        pthread_attr_destroy(&attr);
    }
#endif
    block_run *outer = B;
    B = &b;
    bool ok = true;
    for (;;) {
        // Every thread of the last round waits or is done: the next
        // round's are those released.
        if (order.empty()) {
            int r = release(b);
            if (r == 0) break;
            if (r < 0) {
                ok = false;
                break;
            }
        }
        shuffle(order);
        // The round: each thread passes to the next, the last back here
        // (or a fault's handler, at once).
        b.pos = (size_t)-1;
        pass(&b.sched);
        b.cur = -1;
        order.clear();
        if (b.fault) break;
    }
    B = outer;
    if (b.fault) return cudaErrorIllegalAddress;
    return ok ? cudaSuccess : cudaErrorLaunchFailure;
}

struct grid_rec {
    dim3 grid, block;
    void (*fn)(void *);
    size_t size;
    // the kernel's arguments follow
};

void grid_run(void *p)
{
    grid_rec *g = static_cast<grid_rec *>(p);
    void *arg = g + 1;
    size_t blocks = (size_t)g->grid.x * g->grid.y * g->grid.z;
    std::vector<size_t> order(blocks);
    for (size_t i = 0; i < blocks; i++) order[i] = i;
    shuffle(order);
    dim3 saved_bd = emu_blockDim, saved_gd = emu_gridDim;
    uint3 saved_bi = emu_blockIdx, saved_ti = emu_threadIdx;
    emu_blockDim = g->block;
    emu_gridDim = g->grid;
    fault_handlers();
    for (size_t k : order) {
        emu_blockIdx = make_uint3((unsigned)(k % g->grid.x), (unsigned)(k / g->grid.x % g->grid.y),
                                  (unsigned)(k / ((size_t)g->grid.x * g->grid.y)));
        cudaError_t e = run_block(g->block, g->fn, arg);
        if (e != cudaSuccess) {
            emu_rt_device_error(e);
            break;
        }
    }
    emu_blockDim = saved_bd;
    emu_gridDim = saved_gd;
    emu_blockIdx = saved_bi;
    emu_threadIdx = saved_ti;
}

}  // namespace

void emu_syncthreads(void)
{
    if (B) yield(SYNC);
}

int emu_lane(void)
{
    return B ? B->cur & 31 : 0;
}

void emu_fiber_main(void)
{
    ASAN_ARRIVE(nullptr);
    B->fn(B->arg);
    B->f[(size_t)B->cur].st = DONE;
    pass(nullptr);
    __builtin_unreachable();
}

uint64_t emu_shfl(unsigned mask, uint64_t bits, int src)
{
    if (!B) return bits;
    int me = B->cur;
    if (!(mask & (1u << (me & 31)))) {
        // A lane outside its own mask: undefined on a device; here a hang.
        B->bad = true;
        yield(WARP);
        return bits;
    }
    fiber &f = B->f[(size_t)me];
    f.posted = bits;
    f.mask = mask;
    f.src = src;
    yield(WARP); // release() makes the exchange
    return B->f[(size_t)me].posted;
}

void emu_kernel_seed(uint64_t seed)
{
    rng = seed ? seed : 1;
}

cudaError_t emu_launch(cudaStream_t stream, dim3 grid, dim3 block, size_t shared,
                       void (*fn)(void *arg), const void *arg, size_t arg_size)
{
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!threads || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        !grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535 || shared > 48 * 1024) {
        emu_rt_device_error(cudaErrorInvalidConfiguration);
        return cudaErrorInvalidConfiguration;
    }
    size_t total = sizeof(grid_rec) + arg_size;
    char *rec = (char *)malloc(total);
    if (!rec) {
        emu_rt_device_error(cudaErrorMemoryAllocation);
        return cudaErrorMemoryAllocation;
    }
    grid_rec g = {grid, block, fn, arg_size};
    memcpy(rec, &g, sizeof(g));
    memcpy(rec + sizeof(g), arg, arg_size);
    int e = emu_rt_enqueue(stream, grid_run, rec, total);
    free(rec);
    return (cudaError_t)e;
}
