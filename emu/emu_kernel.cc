// emu_kernel.cc - the scheduler behind emu_kernel.h: a launch becomes one
// record on its stream (emu_rt.c runs it now or keeps it in a graph);
// running it runs the grid's blocks one by one in a shuffled order, and a
// block's threads as ucontext contexts on the running host thread. The
// scheduler runs every runnable thread once, in a fresh shuffled order,
// until each has finished or waits (at __syncthreads or a shuffle); then
// it releases a warp whose named lanes all wait at a shuffle, or else the
// block when all its live threads wait at __syncthreads. Nothing to
// release while threads still wait is a hung kernel: the launch fails
// with cudaErrorLaunchFailure (sticky), as a device's watchdog would end
// it.
//
// Threads: each host thread has its own scheduler state (thread_local);
// the stacks are made once per host thread and kept.
#include "emu_kernel.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <vector>

#include "emu_rt.h"

// AddressSanitizer is told of every switch between the scheduler's stack
// and a thread's, so that it checks each on its own stack (no-ops in a
// build without it).
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ASAN_LEAVE(fake, bottom, size) __sanitizer_start_switch_fiber(fake, bottom, size)
#define ASAN_ARRIVE(fake, bottom, size) __sanitizer_finish_switch_fiber(fake, bottom, size)
#define ASAN_FRESH(stack, size) ASAN_UNPOISON_MEMORY_REGION(stack, size)
#else
#define ASAN_LEAVE(fake, bottom, size) ((void)(fake), (void)(bottom), (void)(size))
#define ASAN_ARRIVE(fake, bottom, size) ((void)(fake), (void)(bottom), (void)(size))
#define ASAN_FRESH(stack, size) ((void)(stack), (void)(size))
#endif

thread_local uint3 emu_threadIdx, emu_blockIdx;
thread_local dim3 emu_blockDim, emu_gridDim;

namespace {

constexpr size_t kStack = 64 << 10;

enum state { READY, SYNC, WARP, DONE };

struct fiber {
    ucontext_t ctx;
    state st;
    unsigned mask;   // the shuffle it waits at
    uint64_t posted; // the value it posted there
    uint3 tid;
};

struct block_run {
    std::vector<fiber> f;
    ucontext_t sched;
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
thread_local const void *sched_bottom; // the scheduler's stack, for ASAN_LEAVE
thread_local size_t sched_size;
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
    for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[next() % i]);
}

void entry()
{
    ASAN_ARRIVE(nullptr, &sched_bottom, &sched_size);
    B->fn(B->arg);
    B->f[B->cur].st = DONE; // returns to the scheduler (uc_link)
    ASAN_LEAVE(nullptr, sched_bottom, sched_size);
}

void yield(state s)
{
    fiber &me = B->f[B->cur];
    me.st = s;
    void *fake = nullptr;
    ASAN_LEAVE(&fake, sched_bottom, sched_size);
    swapcontext(&me.ctx, &B->sched);
    ASAN_ARRIVE(fake, &sched_bottom, &sched_size);
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
        ASAN_LEAVE(nullptr, sched_bottom, sched_size);
        setcontext(&B->sched);
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

// Releases what can go on; 0 when nothing can (all done, or hung: -1).
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
            for (int l = 0; l < lanes; l++)
                if (waiting & (1u << l)) b.f[w + l].st = READY;
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
    for (fiber &f : b.f)
        if (f.st == SYNC) f.st = READY;
    return 1;
}

// Apart from run_block: getcontext returns twice, and run_block's
// locals must not live across it.
__attribute__((noinline)) void fiber_init(fiber &f, char *stack, ucontext_t *link)
{
    getcontext(&f.ctx);
    ASAN_FRESH(stack, kStack); // what a thread that never returned left poisoned
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = link;
    makecontext(&f.ctx, entry, 0);
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
    for (int i = 0; i < n; i++) {
        fiber &f = b.f[(size_t)i];
        f.st = READY;
        f.tid = make_uint3((unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y));
        fiber_init(f, S.s[(size_t)i], &b.sched);
    }
    fault_handlers();
    block_run *outer = B;
    B = &b;
    std::vector<int> order;
    bool ok = true;
    for (;;) {
        order.clear();
        for (int i = 0; i < n; i++)
            if (b.f[(size_t)i].st == READY) order.push_back(i);
        if (order.empty()) {
            int r = release(b);
            if (r == 0) break;
            if (r < 0) {
                ok = false;
                break;
            }
            continue;
        }
        shuffle(order);
        for (int i : order) {
            b.cur = i;
            emu_threadIdx = b.f[(size_t)i].tid;
            void *fake = nullptr;
            ASAN_LEAVE(&fake, S.s[(size_t)i], kStack);
            swapcontext(&b.sched, &b.f[(size_t)i].ctx);
            ASAN_ARRIVE(fake, nullptr, nullptr);
            if (b.fault) break;
        }
        b.cur = -1;
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

uint64_t emu_shfl(unsigned mask, uint64_t bits, int src)
{
    if (!B) return bits;
    int me = B->cur, w = me & ~31;
    if (!(mask & (1u << (me & 31)))) {
        // A lane outside its own mask: undefined on a device; here a hang.
        B->bad = true;
        yield(WARP);
        return bits;
    }
    B->f[(size_t)me].posted = bits;
    B->f[(size_t)me].mask = mask;
    yield(WARP);
    uint64_t r = bits;
    if (src >= 0 && src < 32 && (mask & (1u << src)) && (size_t)(w + src) < B->f.size())
        r = B->f[(size_t)(w + src)].posted;
    B->f[(size_t)me].mask = mask;
    yield(WARP); // nobody posts again before every lane has read
    return r;
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
