/* A FIFO turnstile in front of the GIL for threads coming back from a wait (csrc/core/waits.pxi).
 *
 * CPython's GIL lets every thread that wants it wait on one condition variable with a 5 ms timeout
 * (the switch interval), after which it asks the holder to drop the GIL and waits again. When the
 * threads of a large world wake together (an exchange completes and each rank's synchronisation
 * returns), hundreds of them wait for the GIL at once: each times out every 5 ms and fights for the
 * GIL's mutex, and that churn costs more than the Python they then run. Threads that pass this
 * turnstile before taking the GIL wait for it one at a time: the others sleep in a queue (one futex
 * each, no timeout) and are woken in arrival order, each by the thread before it once that one holds
 * the GIL.
 *
 * An MCS queue lock: each waiting thread spins on (sleeps on) its own node, so passing the turnstile
 * wakes exactly one thread. A thread enters without the GIL and leaves holding it; it holds nothing
 * else in between, so the turnstile cannot close a cycle with the GIL. After fork() the child has
 * only the forking thread, which holds the GIL and is not in the queue: the queue starts empty. */
#ifndef ACLNNPY_GIL_TURNSTILE_H
#define ACLNNPY_GIL_TURNSTILE_H

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct aclnnpy_turn {
    _Atomic(struct aclnnpy_turn *) next;  /* the thread queued after this one */
    atomic_int waiting;                   /* 1 until the thread before it lets it through */
} aclnnpy_turn;

static _Atomic(aclnnpy_turn *) aclnnpy_turn_tail = NULL;  /* the last thread queued, NULL: empty */
static __thread aclnnpy_turn aclnnpy_turn_mine;

static void aclnnpy_turnstile_reset(void) { atomic_store(&aclnnpy_turn_tail, NULL); }

static int aclnnpy_turnstile_init(void) { return pthread_atfork(NULL, NULL, aclnnpy_turnstile_reset); }

/* Queue and sleep until the thread before (if any) has taken the GIL. Called without the GIL. */
static void aclnnpy_turnstile_enter(void) {
    aclnnpy_turn *me = &aclnnpy_turn_mine;
    atomic_store_explicit(&me->next, NULL, memory_order_relaxed);
    atomic_store_explicit(&me->waiting, 1, memory_order_relaxed);
    aclnnpy_turn *prev = atomic_exchange_explicit(&aclnnpy_turn_tail, me, memory_order_acq_rel);
    if (prev == NULL) return;
    atomic_store_explicit(&prev->next, me, memory_order_release);
    while (atomic_load_explicit(&me->waiting, memory_order_acquire))
        syscall(SYS_futex, &me->waiting, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
}

/* Let the next queued thread through. Called holding the GIL, after aclnnpy_turnstile_enter. */
static void aclnnpy_turnstile_leave(void) {
    aclnnpy_turn *me = &aclnnpy_turn_mine;
    aclnnpy_turn *next = atomic_load_explicit(&me->next, memory_order_acquire);
    if (next == NULL) {
        aclnnpy_turn *expected = me;
        if (atomic_compare_exchange_strong_explicit(&aclnnpy_turn_tail, &expected, NULL, memory_order_acq_rel,
                                                    memory_order_acquire))
            return;
        /* a thread queued itself behind this one and is about to link in: let it run (it may share
           this CPU) */
        while ((next = atomic_load_explicit(&me->next, memory_order_acquire)) == NULL) sched_yield();
    }
    atomic_store_explicit(&next->waiting, 0, memory_order_release);
    syscall(SYS_futex, &next->waiting, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#endif
