/* A few persistent worker threads for C kernels that split their work into parts:
 * part_threads_run(fn, ctx, parts) runs fn(ctx, 0) on the calling thread and fn(ctx, p),
 * p = 1 .. parts - 1, on the workers, and returns when all are done. No Python, no GIL:
 * handing a part to a worker through Python's ThreadPoolExecutor cost 50-100 us a call on
 * these machines (the GIL's hand-offs), a condition variable here 3-5 us.
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

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>

static pthread_mutex_t pt_run = PTHREAD_MUTEX_INITIALIZER;  /* one run at a time */
static pthread_mutex_t pt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pt_wake = PTHREAD_COND_INITIALIZER, pt_done = PTHREAD_COND_INITIALIZER;
static int pt_workers = 0, pt_atfork = 0;
static long pt_generation = 0;
static ptrdiff_t pt_parts = 0, pt_pending = 0;
static part_fn pt_fn = NULL;
static void *pt_ctx = NULL;

/* a worker's part and the generation it was created in (the run that created it is the
 * first it serves: it may start only after that run's job was posted) */
typedef struct {
    ptrdiff_t part;
    long generation;
} pt_start;

static void *pt_worker(void *arg)
{
    pt_start start = *(pt_start *)arg;
    ptrdiff_t part = start.part;
    long seen = start.generation;
    free(arg);
    pthread_mutex_lock(&pt_mu);
    for (;;) {
        while (pt_generation == seen) pthread_cond_wait(&pt_wake, &pt_mu);
        seen = pt_generation;
        if (part < pt_parts) {
            part_fn fn = pt_fn;
            void *ctx = pt_ctx;
            pthread_mutex_unlock(&pt_mu);
            fn(ctx, part);
            pthread_mutex_lock(&pt_mu);
            if (--pt_pending == 0) pthread_cond_signal(&pt_done);
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
        pt_workers++;
    }
    pt_fn = fn;
    pt_ctx = ctx;
    pt_parts = parts;
    pt_pending = parts - 1;
    pt_generation++;
    pthread_cond_broadcast(&pt_wake);
    pthread_mutex_unlock(&pt_mu);
    fn(ctx, 0);
    pthread_mutex_lock(&pt_mu);
    while (pt_pending) pthread_cond_wait(&pt_done, &pt_mu);
    pthread_mutex_unlock(&pt_mu);
    pthread_mutex_unlock(&pt_run);
    return 0;
}

#else

static int part_threads_run(part_fn fn, void *ctx, ptrdiff_t parts)
{
    for (ptrdiff_t p = 0; p < parts; p++) fn(ctx, p);
    return 0;
}

#endif
#endif
