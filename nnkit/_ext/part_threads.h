/* A few persistent worker threads for C kernels that split their work into parts:
 * part_threads_run(fn, ctx, parts) runs fn(ctx, 0) on the calling thread and fn(ctx, p),
 * p = 1 .. parts - 1, on the workers, and returns when all are done. No Python, no GIL:
 * handing a part to a worker through Python's ThreadPoolExecutor cost tens of microseconds
 * a call, a large share of a small layer's part; here a spinning worker takes it at once, a sleeping one after the
 * wake-up of another CPU (see PART_THREADS_SPIN_NS and pt_keep_off; benchmarks/RESULTS.md,
 * "Figures moved from code comments" and "Convolution: the window GEMM").
 *
 * Calls from several threads at once run one after another. A forked child starts with no
 * workers (they are created again on its first call). Where POSIX threads are missing, the
 * parts run one after another on the calling thread. */

#ifndef NNKIT_PART_THREADS_H
#define NNKIT_PART_THREADS_H

#include <stddef.h>
#include <stdlib.h>

typedef void (*part_fn)(void *ctx, ptrdiff_t part);

#define PART_THREADS_MAX 256

/* How long a thread waits without sleeping, for a worker its next part and for the caller
 * the workers' ends, before it sleeps on a condition variable: waking a sleeping thread on
 * another core of a virtual machine took as long as a small layer's whole part
 * (benchmarks/RESULTS.md, "Convolution: the window GEMM"); ``part_threads_set_spin``
 * changes it. */
#ifndef PART_THREADS_SPIN_NS
#define PART_THREADS_SPIN_NS 100000L
#endif

#if defined(__x86_64__) || defined(__i386__)
#define PT_PAUSE() __builtin_ia32_pause()
#else
#define PT_PAUSE() ((void)0)
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <sched.h>
#include <time.h>

static pthread_mutex_t pt_run = PTHREAD_MUTEX_INITIALIZER;  /* one run at a time */
static pthread_mutex_t pt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pt_wake = PTHREAD_COND_INITIALIZER, pt_done = PTHREAD_COND_INITIALIZER;
static int pt_workers = 0, pt_atfork = 0;
static long pt_generation = 0;  /* the job's number; written under pt_mu, read spinning too */
static ptrdiff_t pt_parts = 0;
static long pt_pending = 0;  /* parts not yet done; written under pt_mu, read spinning too */
static part_fn pt_fn = NULL;
static void *pt_ctx = NULL;
static long pt_spin_ns = PART_THREADS_SPIN_NS;
static pthread_t pt_threads[PART_THREADS_MAX];
static int pt_kept_off = -1;  /* the CPU the workers are kept off, or -1 */

/* a worker's part and the generation it was created in (the run that created it is the
 * first it serves: it may start only after that run's job was posted) */
typedef struct {
    ptrdiff_t part;
    long generation;
} pt_start;

static long pt_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* wait up to pt_spin_ns, without sleeping, until (*value == ``from``) != ``equal`` */
static void pt_spin(const long *value, long from, int equal)
{
    long deadline = pt_now_ns() + pt_spin_ns;
    while ((__atomic_load_n(value, __ATOMIC_ACQUIRE) == from) == equal) {
        for (int i = 0; i < 16; i++) PT_PAUSE();
        if (pt_now_ns() > deadline) return;
    }
}

static void *pt_worker(void *arg)
{
    pt_start start = *(pt_start *)arg;
    ptrdiff_t part = start.part;
    long seen = start.generation;
    free(arg);
    for (;;) {
        pt_spin(&pt_generation, seen, 1);  /* while no new job */
        pthread_mutex_lock(&pt_mu);
        while (pt_generation == seen) pthread_cond_wait(&pt_wake, &pt_mu);
        seen = pt_generation;
        int mine = part < pt_parts;
        part_fn fn = pt_fn;
        void *ctx = pt_ctx;
        pthread_mutex_unlock(&pt_mu);
        if (mine) {
            fn(ctx, part);
            pthread_mutex_lock(&pt_mu);
            if (__atomic_sub_fetch(&pt_pending, 1, __ATOMIC_ACQ_REL) == 0)
                pthread_cond_signal(&pt_done);
            pthread_mutex_unlock(&pt_mu);
        }
    }
    return NULL;
}

static void pt_after_fork_in_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    pt_run = fresh;
    pt_mu = fresh;
    pt_wake = fresh_cond;
    pt_done = fresh_cond;
    pt_workers = 0;
    pt_kept_off = -1;
}

/* Keep the workers off the caller's CPU ``cpu``. A virtual machine's idle CPU looks
 * preempted to the guest's scheduler, which then wakes a worker on the waker's own CPU: on
 * 2-CPU virtual machines nearly every call after a short pause ran both parts on one CPU,
 * one after the other (benchmarks/RESULTS.md, "Convolution: the window GEMM"). (Linux with
 * _GNU_SOURCE only; elsewhere the scheduler decides.) */
static void pt_keep_off(int cpu)
{
#if defined(__linux__) && defined(CPU_SET)
    cpu_set_t allowed;
    if (cpu < 0 || cpu == pt_kept_off || cpu >= CPU_SETSIZE) return;
    if (sched_getaffinity(0, sizeof allowed, &allowed) || CPU_COUNT(&allowed) < 2) return;
    CPU_CLR(cpu, &allowed);
    for (int w = 0; w < pt_workers; w++)
        pthread_setaffinity_np(pt_threads[w], sizeof allowed, &allowed);
    pt_kept_off = cpu;
#else
    (void)cpu;
#endif
}

static int pt_current_cpu(void)
{
#if defined(__linux__) && defined(CPU_SET)
    return sched_getcpu();
#else
    return -1;
#endif
}

/* the spin before sleeping, in nanoseconds (>= 0); the previous value */
static long part_threads_set_spin(long ns)
{
    long before = pt_spin_ns;
    pt_spin_ns = ns < 0 ? 0 : ns;
    return before;
}

/* 0, or -1 when a worker thread could not be started (nothing was run) */
static int part_threads_run(part_fn fn, void *ctx, ptrdiff_t parts)
{
    if (parts <= 1) {
        if (parts == 1) fn(ctx, 0);
        return 0;
    }
    if (parts > PART_THREADS_MAX) return -1;
    pthread_mutex_lock(&pt_run);
    pthread_mutex_lock(&pt_mu);
    if (!pt_atfork) {
        pthread_atfork(NULL, NULL, pt_after_fork_in_child);
        pt_atfork = 1;
    }
    while (pt_workers < parts - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pt_start *start = malloc(sizeof *start);
        int failed = start == NULL;
        if (start) {
            start->part = pt_workers + 1;
            start->generation = pt_generation;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            failed = pthread_create(&thread, &attr, pt_worker, start);
            pthread_attr_destroy(&attr);
            if (failed) free(start);
        }
        if (failed) {
            pthread_mutex_unlock(&pt_mu);
            pthread_mutex_unlock(&pt_run);
            return -1;
        }
        pt_threads[pt_workers++] = thread;
        pt_kept_off = -1;  /* the new worker may run anywhere: set them all again */
    }
    pt_keep_off(pt_current_cpu());
    pt_fn = fn;
    pt_ctx = ctx;
    pt_parts = parts;
    __atomic_store_n(&pt_pending, parts - 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&pt_generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pt_wake);
    pthread_mutex_unlock(&pt_mu);
    fn(ctx, 0);
    pt_spin(&pt_pending, 0, 0);  /* while some part runs */
    pthread_mutex_lock(&pt_mu);
    while (pt_pending) pthread_cond_wait(&pt_done, &pt_mu);
    pthread_mutex_unlock(&pt_mu);
    pthread_mutex_unlock(&pt_run);
    return 0;
}

#else

static long part_threads_set_spin(long ns)
{
    (void)ns;
    return 0;
}

static int part_threads_run(part_fn fn, void *ctx, ptrdiff_t parts)
{
    for (ptrdiff_t p = 0; p < parts; p++) fn(ctx, p);
    return 0;
}

#endif
#endif
