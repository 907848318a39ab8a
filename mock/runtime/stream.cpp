// Streams and events.
//
// A stream is a FIFO of tasks served by its own worker thread (made when work first needs one) or,
// for tasks that cannot block, by the thread that synchronises it: launch-then-synchronise (the
// common case) then runs on one thread, and a world of many ranks pays no hand-over between a rank's
// thread and its worker. A task that waits for its peers pauses (kTaskPending) instead of blocking,
// so a synchronisation with a time limit still returns in time and leaves the paused task to the
// worker. Work queued without a synchronisation starts on the worker kLazyStartMs later, or as soon
// as a thread waits for it in another way. Handles given to users are opaque numbers (never
// pointers) looked up in a registry, so a destroyed or garbage handle is reported
// (ACL_ERROR_RT_INVALID_HANDLE, 107017) instead of being dereferenced, and a handle value is never
// reused. A NULL stream is the current device's default stream, created lazily and kept for the
// life of the process. Waiting (synchronize, events) uses condition variables, never spinning; only
// a worker whose queue just ran empty polls it for a few microseconds before it sleeps.
//
// Process lifetime: the registries are heap objects that are never destroyed, and this library pins
// itself (RTLD_NODELETE) when it starts its first worker, so at interpreter shutdown or exit() idle
// workers simply stay blocked until the process ends; nothing joins threads from a static
// destructor. In a child after fork() the registries start empty (the parent's workers do not
// exist there); handles inherited from the parent are unknown in the child.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/context_internal.h"
#include "runtime/rt_core.h"
#include "runtime/stream_internal.h"

namespace aclmock {

namespace {
constexpr int kMaxDevices = 1024;
constexpr uintptr_t kStreamHandleBase = 0x5a7e000000000000ULL;
constexpr uintptr_t kEventHandleBase = 0x5a7f000000000000ULL;
std::atomic<uint64_t> g_tasks_run{0};
std::atomic<uint64_t> g_tasks_failed{0};
std::atomic<uint64_t> g_tasks_inline{0};
std::atomic<uint64_t> g_workers_started{0};
std::atomic<uint64_t> g_late_starts{0};
std::atomic<uint64_t> g_next_id{1};
thread_local const Stream *t_worker_of = nullptr;
using Clock = std::chrono::steady_clock;
thread_local PendingWait t_pending;   // what the task that just returned kTaskPending waits for
// The lazy start of queued work nobody synchronised (kLazyStartMs), or of a task paused at a wait
// when its synchronisation's slice ran out (kPausedLazyStartMs: its thread usually comes straight
// back for the next slice, and it has already arrived where its peers wait for it).
enum class LateStart { Queued, Paused };
void start_later(std::weak_ptr<Stream> s, LateStart kind = LateStart::Queued);
// Streams this thread queued work on that waits for a synchronisation: when this thread blocks in a
// synchronisation of another stream, it will not run that work meanwhile, so it starts it then (one
// thread driving the streams of several ranks launches on each, then synchronises them in turn).
thread_local std::vector<std::weak_ptr<Stream>> t_queued;
constexpr size_t kQueuedKept = 64;
void start_queued_elsewhere(const Stream *self);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}
}  // namespace

void pin_library_of(const void *addr) {
    Dl_info info;
    if (addr && dladdr(addr, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);  // handle kept on purpose
}

void pin_library() {
    static std::once_flag once;
    std::call_once(once, [] { pin_library_of(reinterpret_cast<const void *>(&pin_library)); });
}

class Stream : public std::enable_shared_from_this<Stream> {
public:
    Stream(uint64_t id_, int32_t dev, bool is_default, uint64_t ctx = 0)
        : id(id_), device(dev), default_(is_default), context(ctx) {}

    // Drains the queue, then stops and joins the worker (if the stream ever needed one).
    void shutdown() {
        bool work_left;
        {
            std::lock_guard<std::mutex> lk(mu);
            stop = true;
            work_left = busy || !q.empty();
        }
        if (work_left) ensure_worker();   // it finishes what is queued (and waits for a running task)
        std::call_once(worker_made, [] {});   // from now on no worker is made
        cv_work.notify_all();
        if (worker.joinable()) worker.join();
    }

    // `drained_now`: the caller drains up to this task at once, so no one else need start it.
    aclError push(Task t, const char *name, bool may_block, uint64_t *ticket, bool drained_now = false) {
        bool wake = false, later = false;
        {
            std::lock_guard<std::mutex> lk(mu);
            if (stop)
                return fail(ACL_ERROR_RT_INVALID_HANDLE, "%s: the stream is being destroyed",
                            name ? name : "enqueue");
            q.push_back(Item{std::move(t), name ? name : "task", ++submitted, may_block});
            if (ticket) *ticket = submitted;
            wake = may_block;
            later = !wake && !drained_now && !start_listed;
            start_listed = start_listed || later;
        }
        if (wake) wake_worker();
        if (later) start_later(weak_from_this());
        if (drained_now) return ACL_SUCCESS;
        if (!may_block && (t_queued.empty() || t_queued.back().lock().get() != this)) {
            if (t_queued.size() >= kQueuedKept) start_queued_elsewhere(nullptr);
            t_queued.push_back(weak_from_this());
        }
        return ACL_SUCCESS;
    }

    // Runs or waits for the work up to `ticket`: the calling thread runs the tasks that cannot
    // block itself, the worker the others. False when `deadline` passed first; the work left (a task
    // paused at a wait for peers, say) then goes as leave_paused says.
    bool drain(uint64_t ticket, Clock::time_point deadline) {
        std::unique_lock<std::mutex> lk(mu);
        while (completed < ticket) {
            // No task starts after the deadline: a zero timeout only looks.
            const bool in_time = deadline == Clock::time_point::max() || Clock::now() < deadline;
            if (in_time && !busy && !q.empty() && !q.front().may_block && q.front().ticket <= ticket) {
                Item it = std::move(q.front());
                q.pop_front();
                busy = true;
                lk.unlock();
                const bool done = run_inline(it, deadline);
                lk.lock();
                if (!done) {
                    q.push_front(std::move(it));
                    busy = false;
                    leave_paused(lk);
                    return false;
                }
                continue;
            }
            // The worker runs what this thread may not; what it may, once it gives up, goes as
            // leave_paused says.
            if (!busy && !q.empty()) {
                if (q.front().may_block || q.front().ticket > ticket) {
                    wake_worker();
                } else if (!in_time) {
                    leave_paused(lk);
                    lk.lock();
                }
            }
            if (in_time) {
                lk.unlock();
                start_queued_elsewhere(this);
                lk.lock();
                if (completed >= ticket) break;
            }
            if (deadline == Clock::time_point::max())
                cv_done.wait(lk);
            else if (!in_time || (cv_done.wait_until(lk, deadline) == std::cv_status::timeout && completed < ticket))
                return completed >= ticket;
        }
        // Work queued by other threads after `ticket` still has to start.
        if (!busy && !q.empty()) {
            lk.unlock();
            wake_worker();
        }
        return true;
    }

    // This synchronising thread gives up on the queued work (its time ran out, perhaps with the head
    // task paused at a wait). A stream that has a worker thread hands the work over at once. One
    // without waits for the thread to come back for its next slice, as it usually does, and makes its
    // worker only if none has within kPausedLazyStartMs (a world whose first exchange outlasts a
    // slice would otherwise start a worker thread on every rank's stream). Called with `lk` held;
    // returns with it released.
    void leave_paused(std::unique_lock<std::mutex> &lk) {
        if (worker_running.load(std::memory_order_acquire)) {
            lk.unlock();
            wake_worker();
            return;
        }
        const bool list = !start_listed;
        start_listed = true;
        lk.unlock();
        if (list) start_later(weak_from_this(), LateStart::Paused);
    }

    // Work waits and nobody runs it: the worker starts it. `late`: the lazy starter's call.
    void start_now(bool late = false) {
        bool wake;
        {
            std::lock_guard<std::mutex> lk(mu);
            if (late) start_listed = false;
            wake = !busy && !q.empty();
        }
        if (!wake) return;
        if (late) g_late_starts.fetch_add(1, std::memory_order_relaxed);
        wake_worker();
    }

    const uint64_t id;
    const int32_t device;
    const bool default_;
    const uint64_t context;   // the explicit context it was created in, 0 for the default one

    std::mutex mu;
    std::condition_variable cv_work, cv_done;
    std::atomic<uint64_t> submitted{0};  // written under mu; read without it by a polling worker
    uint64_t completed = 0;
    int first_err = 0;
    std::string first_msg;

private:
    struct Item {
        Task fn;
        const char *name;
        uint64_t ticket;
        bool may_block;
    };

    // Runs `it` until it is done (true; its outcome recorded) or `deadline` passes while it is
    // paused (false; it keeps its state for the next runner). The caller holds `busy`.
    bool run_until(Item &it, Clock::time_point deadline) {
        for (;;) {
            clear_error();
            t_pending = PendingWait{};
            int rc;
            try {
                rc = it.fn ? it.fn() : ACL_SUCCESS;
            } catch (const std::exception &e) {
                rc = fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: task threw an exception: %s", it.name, e.what());
            } catch (...) {
                rc = fail(ACL_ERROR_RT_INTERNAL_ERROR, "%s: task threw an exception", it.name);
            }
            if (rc != kTaskPending) {
                finish(it, rc);
                return true;
            }
            const PendingWait w = t_pending;
            const auto now = Clock::now();
            if (now >= deadline) return false;
            start_queued_elsewhere(this);
            double slice = kPausedSliceSeconds;
            if (deadline != Clock::time_point::max())
                slice = std::min(slice, std::chrono::duration<double>(deadline - now).count());
            if (w.sleep)
                w.sleep(w.arg, slice);
            else
                std::this_thread::sleep_for(std::chrono::duration<double>(std::min(slice, 1e-3)));
        }
    }

    // The same on a thread that synchronises: it acts as the worker meanwhile, and keeps its own
    // recent error message.
    bool run_inline(Item &it, Clock::time_point deadline) {
        const Stream *was = t_worker_of;
        std::string own = take_error();
        t_worker_of = this;
        const bool done = run_until(it, deadline);
        if (done) g_tasks_inline.fetch_add(1, std::memory_order_relaxed);
        t_worker_of = was;
        set_error(own);
        return done;
    }

    void finish(Item &it, int rc) {
        std::string msg;
        if (rc != 0) {
            msg = take_error();
            if (msg.empty()) msg = format("%s: failed on the stream with code %d", it.name, rc);
            g_tasks_failed.fetch_add(1);
        } else {
            clear_error();
        }
        it.fn = nullptr;  // release captured resources before the task counts as done
        g_tasks_run.fetch_add(1);
        {
            std::lock_guard<std::mutex> lk(mu);
            if (rc != 0 && first_err == 0) {
                first_err = rc;
                first_msg = std::move(msg);
            }
            completed = it.ticket;
            busy = false;
        }
        cv_done.notify_all();
    }

    // The worker is made when work first needs it: a stream whose work the synchronising thread
    // runs (launch, then synchronise) never has one, and creating or destroying it starts or joins
    // no thread (a world of a thousand thread ranks made and joined a thousand idle workers).
    void ensure_worker() {
        std::call_once(worker_made, [this] {
            pin_library();
            worker = std::thread([this] { loop(); });
            worker_running.store(true, std::memory_order_release);
            g_workers_started.fetch_add(1, std::memory_order_relaxed);
        });
    }

    void wake_worker() {
        ensure_worker();
        cv_work.notify_one();
    }

    void loop() {
        t_worker_of = this;
        for (;;) {
            Item it;
            {
                std::unique_lock<std::mutex> lk(mu);
                if (q.empty() && !stop) {
                    uint64_t seen = submitted;
                    lk.unlock();
                    poll_for_work(seen);
                    lk.lock();
                }
                cv_work.wait(lk, [&] { return !busy && (stop || !q.empty()); });
                if (q.empty()) return;  // stop requested and drained
                it = std::move(q.front());
                q.pop_front();
                busy = true;
            }
            run_until(it, Clock::time_point::max());
        }
    }

    // An idle worker polls for new work a few microseconds before it sleeps: a host that launches
    // steadily (a serving loop) then never pays a futex wake per launch, as a device's doorbell costs
    // no system call; a quiet stream sleeps on the condition variable as before.
    void poll_for_work(uint64_t seen) const {
        auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kPollMicros);
        for (int i = 1;; ++i) {
            if (submitted.load(std::memory_order_acquire) != seen) return;
            cpu_relax();
            if (i % 64 == 0) {
                if (std::chrono::steady_clock::now() >= until) return;
                std::this_thread::yield();
            }
        }
    }

    static constexpr int kPollMicros = 20;
    // A paused task is looked at again at least this often (destruction, liveness, timeouts).
    static constexpr double kPausedSliceSeconds = 0.05;
    std::deque<Item> q;
    bool busy = false;           // a thread (the worker or a synchronising one) runs the head task
    bool start_listed = false;   // the queue is on the lazy starter's list
    bool stop = false;
    std::once_flag worker_made;
    std::atomic<bool> worker_running{false};   // the worker thread exists
    std::thread worker;
};

namespace {
// Starts, kLazyStartMs after it was queued (kPausedLazyStartMs for a paused task), the work no thread
// synchronised for: the worker of a stream whose queue waits for a synchronising thread is woken only
// if none comes. One thread per process sleeps until the earliest such queue is due (each list is in
// due order: one delay per list).
struct LazyStarter {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<std::weak_ptr<Stream>, Clock::time_point>> due[2];   // by LateStart
    bool all_now = false;   // start_waiting_work(): start every listed queue at once
    bool running = false;
    bool empty() const { return due[0].empty() && due[1].empty(); }
    Clock::time_point next() const {
        if (due[0].empty()) return due[1].front().second;
        if (due[1].empty()) return due[0].front().second;
        return std::min(due[0].front().second, due[1].front().second);
    }
};
// The starter wakes on ticks of kLazyTickMs and starts every entry due by then: entries queued
// close together share one wake-up. Each of its wake-ups takes a CPU from the threads that run the
// work, and may preempt one holding a lock (the GIL of a thread world) that the others then queue
// for; waking at each entry's own due time cost a thread world of 768 ranks ~1800 wake-ups a second.
constexpr int kLazyTickMs = 2;
Clock::time_point on_tick(Clock::time_point t) {
    const auto tick = std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(kLazyTickMs));
    const auto since = t.time_since_epoch();
    return Clock::time_point((since + tick - Clock::duration(1)) / tick * tick);
}

LazyStarter *g_starter = nullptr;
std::once_flag g_starter_once;

LazyStarter &starter() {
    std::call_once(g_starter_once, [] {
        pin_library();
        g_starter = new LazyStarter;   // never destroyed (its thread outlives static destructors)
        // In a child after fork the thread does not exist, and the parent's queues are not its own.
        pthread_atfork(nullptr, nullptr, [] { g_starter = new LazyStarter; });
    });
    return *g_starter;
}

void starter_loop(LazyStarter *st) {
    std::vector<std::weak_ptr<Stream>> ready;
    std::unique_lock<std::mutex> lk(st->mu);
    for (;;) {
        st->cv.wait(lk, [&] { return !st->empty(); });
        if (const auto at = on_tick(st->next()); !st->all_now && Clock::now() < at) {
            // then look again: woken early by start_waiting_work, or by an entry of the other list due
            // before `at`
            st->cv.wait_until(lk, at);
            continue;
        }
        const bool all = st->all_now;
        st->all_now = false;
        const auto now = Clock::now();
        for (auto &d : st->due)
            while (!d.empty() && (all || d.front().second <= now)) {
                ready.push_back(std::move(d.front().first));
                d.pop_front();
            }
        lk.unlock();
        for (auto &w : ready)
            if (auto s = w.lock()) s->start_now(true);
        ready.clear();
        lk.lock();
    }
}

void start_later(std::weak_ptr<Stream> s, LateStart kind) {
    LazyStarter &st = starter();
    const auto at = Clock::now() + std::chrono::milliseconds(kind == LateStart::Paused ? kPausedLazyStartMs
                                                                                        : kLazyStartMs);
    bool wake;
    {
        std::lock_guard<std::mutex> lk(st.mu);
        if (!st.running) {
            st.running = true;
            std::thread(starter_loop, &st).detach();
        }
        // else the starter already sleeps until a tick no later than this entry's
        wake = st.empty() || on_tick(at) < on_tick(st.next());
        st.due[int(kind)].emplace_back(std::move(s), at);
    }
    if (wake) st.cv.notify_one();
}

void start_queued_elsewhere(const Stream *self) {
    if (t_queued.empty()) return;
    std::vector<std::weak_ptr<Stream>> queued;
    queued.swap(t_queued);
    for (auto &w : queued)
        if (auto s = w.lock(); s && s.get() != self) s->start_now();
}

}  // namespace

void set_pending_wait(PendingWait w) { t_pending = w; }

void start_waiting_work() {
    LazyStarter &st = starter();
    {
        std::lock_guard<std::mutex> lk(st.mu);
        if (st.empty()) return;
        st.all_now = true;
    }
    st.cv.notify_one();
}

class Event {
public:
    explicit Event(uint64_t id_) : id(id_) {}
    const uint64_t id;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;   // number of records issued
    uint64_t completed = 0;  // latest record (by issue order) that the stream reached
    std::chrono::steady_clock::time_point stamp;
};

namespace {
struct Registry {
    std::mutex mu;
    std::unordered_map<uint64_t, std::shared_ptr<Stream>> streams;
    std::unordered_map<uint64_t, std::shared_ptr<Event>> events;
    std::shared_ptr<Stream> defaults[kMaxDevices];
    size_t n_defaults = 0;
    // Streams released by a reset or a context's destruction: kept (stopped) so that a raw pointer
    // another thread resolved just before stays valid memory.
    std::vector<std::shared_ptr<Stream>> retired;
};

Registry *g_reg = nullptr;
std::once_flag g_reg_once;

Registry &reg() {
    std::call_once(g_reg_once, [] {
        g_reg = new Registry;
        pin_library();
        pthread_atfork([] { g_reg->mu.lock(); }, [] { g_reg->mu.unlock(); },
                       [] {
                           // The parent's workers do not exist here: start over (the old registry is
                           // abandoned, not destroyed, since its threads' objects are not usable).
                           g_reg->mu.unlock();
                           g_reg = new Registry;
                       });
    });
    return *g_reg;
}

void *stream_handle(uint64_t id) { return reinterpret_cast<void *>(kStreamHandleBase + id * 16); }
void *event_handle(uint64_t id) { return reinterpret_cast<void *>(kEventHandleBase + id * 16); }
bool handle_id(const void *h, uintptr_t base, uint64_t *id) {
    uintptr_t v = reinterpret_cast<uintptr_t>(h);
    if (v < base || (v - base) % 16 != 0 || v - base >= (uintptr_t(1) << 47)) return false;
    *id = (v - base) / 16;
    return true;
}

std::shared_ptr<Stream> find_stream(aclrtStream h) {
    uint64_t id;
    if (!handle_id(h, kStreamHandleBase, &id)) return nullptr;
    Registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.streams.find(id);
    return it == r.streams.end() ? nullptr : it->second;
}

std::shared_ptr<Event> find_event(aclrtEvent h) {
    uint64_t id;
    if (!handle_id(h, kEventHandleBase, &id)) return nullptr;
    Registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.events.find(id);
    return it == r.events.end() ? nullptr : it->second;
}

aclError bad_event(const char *api, const char *param, aclrtEvent h) {
    if (!h) return fail(ACL_ERROR_INVALID_PARAM, "%s: %s must not be NULL", api, param);
    return fail(ACL_ERROR_RT_INVALID_HANDLE,
                "%s: %s %p is not a live event (never created, or already destroyed)", api, param, h);
}
}  // namespace

Stream *resolve_stream(aclrtStream handle, aclError *err, const char *api) {
    aclError dummy;
    if (!err) err = &dummy;
    if (!api) api = "stream";
    if (!handle) {
        int32_t dev = current_device();
        if (dev < 0 || dev >= kMaxDevices) {
            *err = fail(ACL_ERROR_RT_CONTEXT_NULL,
                        "%s: stream is NULL (the default stream) but no device is set on this "
                        "thread (call aclrtSetDevice first)", api);
            return nullptr;
        }
        Registry &r = reg();
        std::lock_guard<std::mutex> lk(r.mu);
        if (!r.defaults[dev]) {
            auto s = std::make_shared<Stream>(g_next_id.fetch_add(1), dev, true);
            r.defaults[dev] = s;
            ++r.n_defaults;
        }
        *err = ACL_SUCCESS;
        return r.defaults[dev].get();
    }
    std::shared_ptr<Stream> s = find_stream(handle);
    if (!s) {
        *err = fail(ACL_ERROR_RT_INVALID_HANDLE,
                    "%s: stream %p is not a live stream (never created, or already destroyed)", api,
                    handle);
        return nullptr;
    }
    *err = ACL_SUCCESS;
    return s.get();
}

Stream *resolve_stream(aclrtStream handle, aclError *err) { return resolve_stream(handle, err, nullptr); }

namespace {
aclError queue_task(Stream *s, Task task, const char *name, bool may_block, uint64_t *ticket,
                    bool drained_now = false) {
    if (!s) return fail(ACL_ERROR_INVALID_PARAM, "%s: stream is NULL", name ? name : "enqueue");
    return s->push(std::move(task), name, may_block, ticket, drained_now);
}
}  // namespace

aclError enqueue_and_wait(Stream *s, Task task, const char *name) {
    uint64_t ticket = 0;
    if (aclError err = queue_task(s, std::move(task), name, false, &ticket, true)) return err;
    s->drain(ticket, Clock::time_point::max());
    return ACL_SUCCESS;
}

aclError enqueue(Stream *s, Task task, const char *name, bool may_block) {
    return queue_task(s, std::move(task), name, may_block, nullptr);
}

int32_t stream_device(const Stream *s) { return s ? s->device : -1; }

bool on_stream_worker(const Stream *s) { return s && t_worker_of == s; }

bool on_any_stream_worker() { return t_worker_of != nullptr; }

void release_streams_of(int32_t dev, uint64_t ctx) {
    std::vector<std::shared_ptr<Stream>> gone;
    Registry &r = reg();
    {
        std::lock_guard<std::mutex> lk(r.mu);
        for (auto it = r.streams.begin(); it != r.streams.end();) {
            Stream *s = it->second.get();
            // a task of the stream itself cannot wait for its own stream to drain: that one stays
            if (s->device == dev && s->context == ctx && !on_stream_worker(s)) {
                gone.push_back(it->second);
                r.retired.push_back(it->second);
                it = r.streams.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto &s : gone) s->shutdown();   // runs everything already queued first
}

StreamStats stream_stats() {
    Registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    StreamStats st;
    st.live_streams = r.streams.size();
    st.live_events = r.events.size();
    st.default_streams = r.n_defaults;
    st.tasks_run = g_tasks_run.load();
    st.tasks_failed = g_tasks_failed.load();
    st.tasks_run_by_synchronise = g_tasks_inline.load();
    st.stream_workers_started = g_workers_started.load();
    st.late_starts = g_late_starts.load();
    return st;
}

}  // namespace aclmock

using namespace aclmock;

namespace {
aclError sync_stream(const char *api, aclrtStream stream, int64_t timeout_ms) {
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, api);
    if (!s) return err;
    if (on_stream_worker(s))
        return fail(ACL_ERROR_RT_STREAM_CONTEXT,
                    "%s: called from a task running on the same stream (it would wait for itself)", api);
    const auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
    const uint64_t ticket = s->submitted.load(std::memory_order_acquire);
    const bool done = s->drain(ticket, deadline);
    std::unique_lock<std::mutex> lk(s->mu);
    if (!done && s->completed < ticket) {
        uint64_t pending = ticket - s->completed;
        lk.unlock();
        return fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                    "%s: timed out after %lld ms with %llu task(s) still pending", api,
                    static_cast<long long>(timeout_ms), static_cast<unsigned long long>(pending));
    }
    int code = s->first_err;
    std::string msg;
    msg.swap(s->first_msg);
    s->first_err = 0;
    lk.unlock();
    if (code != 0) {
        set_error(msg);
        return code;
    }
    return ACL_SUCCESS;
}
}  // namespace

extern "C" {

ACLMOCK_API aclError aclrtCreateStream(aclrtStream *stream) {
    if (!stream) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream must not be NULL");
    int32_t dev = current_device();
    if (dev < 0)
        return fail(ACL_ERROR_RT_CONTEXT_NULL,
                    "aclrtCreateStream: no device is set on this thread (call aclrtSetDevice first)");
    uint64_t id = g_next_id.fetch_add(1);
    auto s = std::make_shared<Stream>(id, dev, false, current_context_id());
    Registry &r = reg();
    {
        std::lock_guard<std::mutex> lk(r.mu);
        r.streams.emplace(id, s);
    }
    *stream = stream_handle(id);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtDestroyStream(aclrtStream stream) {
    if (!stream)
        return fail(ACL_ERROR_INVALID_PARAM,
                    "aclrtDestroyStream: stream must not be NULL (the default stream cannot be destroyed)");
    uint64_t id;
    std::shared_ptr<Stream> s;
    Registry &r = reg();
    if (handle_id(stream, kStreamHandleBase, &id)) {
        std::lock_guard<std::mutex> lk(r.mu);
        auto it = r.streams.find(id);
        if (it != r.streams.end()) {
            if (on_stream_worker(it->second.get()))
                return fail(ACL_ERROR_RT_STREAM_CONTEXT,
                            "aclrtDestroyStream: called from a task running on that stream");
            s = it->second;
            r.streams.erase(it);
        }
    }
    if (!s)
        return fail(ACL_ERROR_RT_INVALID_HANDLE,
                    "aclrtDestroyStream: stream %p is not a live stream (never created, or already "
                    "destroyed)", stream);
    s->shutdown();  // runs everything already queued first
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtSynchronizeStream(aclrtStream stream) {
    return sync_stream("aclrtSynchronizeStream", stream, -1);
}

ACLMOCK_API aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
    if (timeout < -1)
        return fail(ACL_ERROR_INVALID_PARAM,
                    "aclrtSynchronizeStreamWithTimeout: timeout must be -1 (wait forever) or >= 0 ms "
                    "(got %d)", timeout);
    return sync_stream("aclrtSynchronizeStreamWithTimeout", stream, timeout);
}

ACLMOCK_API aclError aclrtCreateEvent(aclrtEvent *event) {
    if (!event) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent: event must not be NULL");
    uint64_t id = g_next_id.fetch_add(1);
    auto e = std::make_shared<Event>(id);
    Registry &r = reg();
    {
        std::lock_guard<std::mutex> lk(r.mu);
        r.events.emplace(id, e);
    }
    *event = event_handle(id);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtDestroyEvent(aclrtEvent event) {
    uint64_t id;
    Registry &r = reg();
    if (event && handle_id(event, kEventHandleBase, &id)) {
        std::lock_guard<std::mutex> lk(r.mu);
        // Pending records and waits keep their own reference to the event.
        if (r.events.erase(id)) return ACL_SUCCESS;
    }
    return bad_event("aclrtDestroyEvent", "event", event);
}

ACLMOCK_API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
    std::shared_ptr<Event> e = find_event(event);
    if (!e) return bad_event("aclrtRecordEvent", "event", event);
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, "aclrtRecordEvent");
    if (!s) return err;
    std::lock_guard<std::mutex> lk(e->mu);
    const uint64_t seq = ++e->recorded;
    err = enqueue(s, [e, seq]() -> int {
        {
            std::lock_guard<std::mutex> g(e->mu);
            if (seq > e->completed) {
                e->completed = seq;
                e->stamp = std::chrono::steady_clock::now();
            }
        }
        e->cv.notify_all();
        return ACL_SUCCESS;
    }, "aclrtRecordEvent");
    if (err) --e->recorded;
    return err;
}

ACLMOCK_API aclError aclrtSynchronizeEvent(aclrtEvent event) {
    std::shared_ptr<Event> e = find_event(event);
    if (!e) return bad_event("aclrtSynchronizeEvent", "event", event);
    start_waiting_work();
    std::unique_lock<std::mutex> lk(e->mu);
    const uint64_t target = e->recorded;  // an event never recorded completes at once
    e->cv.wait(lk, [&] { return e->completed >= target; });
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status) {
    if (!status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status must not be NULL");
    std::shared_ptr<Event> e = find_event(event);
    if (!e) return bad_event("aclrtQueryEventStatus", "event", event);
    start_waiting_work();   // a host polling the event expects the work to go on
    std::lock_guard<std::mutex> lk(e->mu);
    // NOT_READY until the latest record has been reached (also when never recorded).
    *status = (e->recorded > 0 && e->completed >= e->recorded) ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                                                                : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent) {
    if (!ms) return fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms must not be NULL");
    std::shared_ptr<Event> a = find_event(startEvent);
    if (!a) return bad_event("aclrtEventElapsedTime", "startEvent", startEvent);
    std::shared_ptr<Event> b = find_event(endEvent);
    if (!b) return bad_event("aclrtEventElapsedTime", "endEvent", endEvent);
    std::chrono::steady_clock::time_point ta, tb;
    const char *names[2] = {"startEvent", "endEvent"};
    Event *evs[2] = {a.get(), b.get()};
    std::chrono::steady_clock::time_point *ts[2] = {&ta, &tb};
    for (int i = 0; i < 2; ++i) {
        std::lock_guard<std::mutex> lk(evs[i]->mu);
        if (evs[i]->recorded == 0)
            return fail(ACL_ERROR_RT_EVENT_NOT_COMPLETE,
                        "aclrtEventElapsedTime: %s was never recorded (aclrtRecordEvent)", names[i]);
        if (evs[i]->completed < evs[i]->recorded)
            return fail(ACL_ERROR_RT_EVENT_NOT_COMPLETE,
                        "aclrtEventElapsedTime: the latest record of %s has not completed yet "
                        "(synchronize the event or its stream first)", names[i]);
        *ts[i] = evs[i]->stamp;
    }
    *ms = static_cast<float>(std::chrono::duration<double, std::milli>(tb - ta).count());
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
    std::shared_ptr<Event> e = find_event(event);
    if (!e) return bad_event("aclrtStreamWaitEvent", "event", event);
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, "aclrtStreamWaitEvent");
    if (!s) return err;
    uint64_t target;
    {
        std::lock_guard<std::mutex> lk(e->mu);
        target = e->recorded;
    }
    if (target == 0) return ACL_SUCCESS;  // nothing recorded yet: no dependency
    return enqueue(s, [e, target]() -> int {
        start_waiting_work();
        std::unique_lock<std::mutex> lk(e->mu);
        e->cv.wait(lk, [&] { return e->completed >= target; });
        return ACL_SUCCESS;
    }, "aclrtStreamWaitEvent", true);
}

}  // extern "C"
