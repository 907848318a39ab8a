// Records of the dispatch calls and the tracing of combine inputs; see round_trace.h.
#include "ops/round_trace.h"

#include <array>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <mutex>

#include "hccl/hccl_core.h"
#include "runtime/rt_core.h"
#include "runtime/stream_internal.h"

namespace aclmock {
namespace moe {

static_assert(kRoundSlotBase + 2 * hccl::kMaxRanks <= hccl::kMailboxCounts, "round words fit the mailbox");

namespace {

// The last kRecordsPerComm dispatch records of a communicator, newest first, in one block, and the
// descriptor serials of their fields apart: a combine compares the descriptor of each routing input
// with every record's before it looks at addresses (a plan's combine reads through descriptors no
// dispatch wrote, so that scan runs to the end), and a record is three cache lines, a serial 8 bytes.
// In a thread world whose ranks no longer fit in the cache each line is a miss; in a deque the
// records also lay in blocks of three across the heap, and every third dispatch allocated one.
class Records {
public:
    class const_iterator {
    public:
        const_iterator(const Records *r, size_t i) : r_(r), i_(i) {}
        const DispatchRecord &operator*() const { return r_->at(i_); }
        const_iterator &operator++() {
            ++i_;
            return *this;
        }
        bool operator!=(const const_iterator &o) const { return i_ != o.i_; }

    private:
        const Records *r_;
        size_t i_;
    };

    void push_newest(const DispatchRecord &rec) {   // the oldest goes once kRecordsPerComm are kept
        newest_ = (newest_ + kRecordsPerComm - 1) % kRecordsPerComm;
        ring_[newest_] = rec;
        for (size_t f = 0; f < kFields.size(); ++f) {
            descs_[f][newest_] = (rec.*kFields[f]).desc;
            if ((rec.*kFields[f]).desc > newest_desc_[f]) newest_desc_[f] = (rec.*kFields[f]).desc;
        }
        if (n_ < kRecordsPerComm) ++n_;
    }
    bool empty() const { return n_ == 0; }
    size_t size() const { return n_; }
    const DispatchRecord &at(size_t i) const { return ring_[slot(i)]; }   // 0: newest
    const_iterator begin() const { return {this, 0}; }
    const_iterator end() const { return {this, n_}; }

    // The first record from `from` on (0: newest) whose `field` was traced through descriptor `desc`;
    // size() when none is.
    size_t next_with_desc(Traced DispatchRecord::*field, uint64_t desc, size_t from) const {
        size_t f = 0;
        while (kFields[f] != field) ++f;
        // Serials grow with every aclCreateTensor: a descriptor made after every one recorded here (a
        // plan's combine reads through descriptors made after its dispatch's) is in no record.
        if (desc > newest_desc_[f]) return n_;
        for (size_t i = from; i < n_; ++i)
            if (descs_[f][slot(i)] == desc) return i;
        return n_;
    }

private:
    static constexpr std::array<Traced DispatchRecord::*, 4> kFields = {
        &DispatchRecord::assist, &DispatchRecord::counts, &DispatchRecord::ids, &DispatchRecord::expand_x};
    size_t slot(size_t i) const { return (newest_ + i) % kRecordsPerComm; }

    std::array<DispatchRecord, kRecordsPerComm> ring_;
    std::array<std::array<uint64_t, kRecordsPerComm>, kFields.size()> descs_;   // [field][slot]
    std::array<uint64_t, kFields.size()> newest_desc_{};   // the largest serial ever recorded, per field
    size_t newest_ = 0, n_ = 0;
};

// The records of one communicator. A dispatch and a combine of the communicator may run on two
// threads (two streams); nothing else takes the lock.
struct CommRecords final : hccl::CommState {
    std::mutex mu;
    Records recs;
};

const char kRecordsKey = 0;   // the records' key among the communicator's states

std::shared_ptr<CommRecords> records_of(hccl::Comm &comm) {
    auto make = []() -> std::shared_ptr<hccl::CommState> {
        // the communicator (libhccl) destroys the records with code of this library: it stays loaded
        static const bool pinned = (pin_library_of(&kRecordsKey), true);
        (void)pinned;
        return std::make_shared<CommRecords>();
    };
    return std::static_pointer_cast<CommRecords>(comm.state(&kRecordsKey, make));
}

// Hashes of one input over the lengths the records ask for, each computed once. A combine asks for
// one or two lengths per input (its own dispatch's, in a steady loop the same every call); a search
// through records of other lengths may ask for more, and those beyond kKept are hashed again.
class Hashes {
public:
    explicit Hashes(const CombineInputs::Input &in) : p_(in.data), capacity_(in.bytes) {}
    uint64_t addr() const { return uint64_t(uintptr_t(p_)); }
    // Whether the input's first t.bytes bytes hash to t.hash (false when it holds fewer, and for an
    // empty region, which would match anything).
    bool matches(const Traced &t) {
        if (!p_ || t.bytes == 0 || t.bytes > capacity_) return false;
        for (size_t i = 0; i < n_; ++i)
            if (kept_[i].bytes == t.bytes && kept_[i].sampled == t.sampled) return kept_[i].hash == t.hash;
        const uint64_t h = t.sampled ? sample_hash(p_, t.bytes) : hash_bytes(p_, t.bytes);
        if (n_ < kKept) kept_[n_++] = Kept{t.bytes, h, t.sampled};
        return h == t.hash;
    }

private:
    struct Kept {
        uint64_t bytes, hash;
        bool sampled;
    };
    static constexpr size_t kKept = 8;
    const void *p_;
    uint64_t capacity_;
    Kept kept_[kKept];
    size_t n_ = 0;
};

// The round of one routing input: the newest record of the same descriptor whose content still
// matches; else the newest record written at the same address whose content still matches; else the
// one round whose content matches; else unknown (none, or several).
int64_t find_round(const Records &recs, Traced DispatchRecord::*field, uint64_t desc,
                   Hashes &h) {
    if (desc)
        for (size_t i = recs.next_with_desc(field, desc, 0); i < recs.size(); i = recs.next_with_desc(field, desc, i + 1))
            if (h.matches(recs.at(i).*field)) return recs.at(i).round;
    for (const DispatchRecord &r : recs)
        if (h.addr() && (r.*field).addr == h.addr() && h.matches(r.*field)) return r.round;
    int64_t found = kUnknownRound;
    for (const DispatchRecord &r : recs) {
        if (!h.matches(r.*field)) continue;
        if (found != kUnknownRound && found != r.round) return kUnknownRound;
        found = r.round;
    }
    return found;
}

const DispatchRecord *record_of(const Records &recs, int64_t round) {
    for (const DispatchRecord &r : recs)
        if (r.round == round) return &r;
    return nullptr;
}

}  // namespace

void record_dispatch(hccl::Comm &comm, const DispatchRecord &rec) {
    const std::shared_ptr<CommRecords> c = records_of(comm);
    if (!c) return;   // the communicator is being destroyed: no combine will look
    std::lock_guard<std::mutex> lk(c->mu);
    c->recs.push_newest(rec);
}

CombineRound trace_combine(hccl::Comm &comm, const CombineInputs &in) {
    CombineRound out;
    const std::shared_ptr<CommRecords> c = records_of(comm);
    if (!c) return out;
    std::lock_guard<std::mutex> lk(c->mu);
    const Records &recs = c->recs;
    if (recs.empty()) return out;
    Hashes assist(in.assist), counts(in.counts);
    const int64_t ra = find_round(recs, &DispatchRecord::assist, in.assist.desc, assist);
    int64_t rc = kUnknownRound;
    for (const DispatchRecord &r : recs)   // the receive slots of this rank's role, no more, no fewer
        if (r.counts.bytes == in.counts.bytes) {
            rc = find_round(recs, &DispatchRecord::counts, in.counts.desc, counts);
            break;
        }
    if (ra != kUnknownRound && rc != kUnknownRound && ra != rc) {
        out.error = format("assist_info_for_combine is the output of the dispatch of collective call #%" PRId64
                           " but ep_send_counts that of call #%" PRId64 " (both must come from the same dispatch)",
                           ra, rc);
        out.round = ra;
        return out;
    }
    out.round = ra != kUnknownRound ? ra : rc;
    if (out.round == kUnknownRound) return out;
    const DispatchRecord *own = record_of(recs, out.round);
    // expert_ids that another traced dispatch read, but not this one
    Hashes ids(in.ids);
    if (own && !ids.matches(own->ids)) {
        for (const DispatchRecord &r : recs)
            if (r.ids.bytes == in.ids.bytes && ids.matches(r.ids)) {
                out.error = format("expert_ids are the input of the dispatch of collective call #%" PRId64 " but "
                                   "assist_info_for_combine / ep_send_counts the output of call #%" PRId64
                                   " (combine takes the expert_ids its dispatch took)", r.round, out.round);
                return out;
            }
    }
    // expand_x still holding, unchanged, the rows another traced dispatch wrote there
    Hashes ex(in.expand_x);
    if (own && ex.matches(own->expand_x)) return out;
    for (const DispatchRecord &r : recs)
        if (((in.expand_x.desc && r.expand_x.desc == in.expand_x.desc) || (ex.addr() && r.expand_x.addr == ex.addr()))
            && r.round != out.round && ex.matches(r.expand_x)) {
            out.error = format("expand_x holds, unchanged, the rows the dispatch of collective call #%" PRId64
                               " wrote, but assist_info_for_combine / ep_send_counts are the output of call #%"
                               PRId64 " (the expert rows must belong to the dispatch the routing comes from)",
                               r.round, out.round);
            return out;
        }
    return out;
}

}  // namespace moe
}  // namespace aclmock
