// The step scheduler: continuous batching over one step kind that mixes decode
// rows and prefill chunks.
//
// schedule() plans one step:
//   1. one decode row for every running request whose prompt is done, oldest
//      admission first;
//   2. the rest of the token budget (max_num_batched_tokens) goes to prefill
//      chunks of waiting and partially prefilled requests in FCFS order. A
//      request is admitted when a state slot is free, fewer than max_num_seqs
//      requests hold one, and pages exist for at least one token of its first
//      chunk (a chunk shrinks to the pages there are). The queue stops at the
//      first request that cannot progress, so a long prompt is never overtaken.
//      No fixed cadence: waiting prompts get the budget every step.
// update() commits the step: advances every planned request, appends the
// sampled tokens, checks stop conditions, and caches full prompt pages.
//
// Preemption (by recompute). When a decode row, or the next chunk of a
// partially prefilled request, needs a page and none is free or evictable, the
// scheduler preempts the MOST RECENTLY ADMITTED request that holds a slot and is
// not yet in this step's plan (for a prefill chunk: only requests admitted after
// it; for a decode row this can be the request itself). The victim releases its
// slot and pages (its cached prompt pages stay findable in the prefix cache) and
// goes back to the front of the queue after this step, keeping its outputs; it
// later recomputes prompt + outputs and continues. A COMPLETION engine cannot
// recompute: its victim finishes with reason "abort".
//
// Prefix cache: on admission the prompt's longest cached prefix (`hit` tokens,
// every ratio) is reused; the request starts at hit - replay_tokens (cut to a
// multiple of every ratio, at most its last token), and rows below `hit` are
// marked is_replay: they only rebuild the SWA state, which is never cached.
// That start is the request's seq_window_start in every later plan: its slot's
// ring holds no key of it below there, so attention must not read one.
//
// Finish reasons: "stop" (eos unless ignore_eos, or a stop token), "length"
// (max_tokens outputs, or max_model_len tokens), "abort" (abort(), or a
// COMPLETION victim), and "prefilled" (PROMPT engine: the prompt is done; the
// slot and pages stay held for handoff() until release_handoff()).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "buckets.h"
#include "prefix_cache.h"
#include "request.h"
#include "scheduler_config.h"
#include "slot_pool.h"
#include "step_plan.h"

namespace dsgraph {

struct StepEvent {
    int64_t rid;
    int32_t token;  // -1 when no token comes with the event (abort)
    bool finished;
    std::string reason;  // empty unless finished
};

// Where a request's caches live: its state slot and pages per ratio, holding
// the entries of its first num_cached tokens.
struct Allocation {
    int64_t rid;
    int32_t slot;
    std::vector<std::vector<int32_t>> pages;
    int32_t num_cached;
    std::vector<int32_t> tokens;
};

class Scheduler {
public:
    explicit Scheduler(SchedulerConfig config);
    Scheduler(const Scheduler &) = delete;  // requests point into each other's queues
    Scheduler &operator=(const Scheduler &) = delete;

    // Queues a request (NORMAL, PROMPT). Throws std::invalid_argument naming the
    // field: rid in use, empty prompt, prompt longer than max_model_len, a token
    // id < 0 (or >= vocab_size), max_tokens < 1, a stop token id < 0.
    void add_request(int64_t rid, std::span<const int32_t> prompt, const StopParams &stop);
    // A request whose caches hold prompt + output except its newest token,
    // filled elsewhere (NORMAL, COMPLETION). Allocates its slot and pages and
    // returns them for the caller to fill. Throws std::runtime_error when no
    // slot or not enough pages are free (see can_add_prefilled).
    Allocation add_prefilled(int64_t rid, std::span<const int32_t> prompt, std::span<const int32_t> output,
                             const StopParams &stop);
    bool can_add_prefilled(int32_t num_tokens) const;
    // Finishes a request with reason "abort" (reported by the next update());
    // false when no such request. Frees a handed-off request without an event.
    bool abort(int64_t rid);
    // Preempts a request holding a slot now (as if pages had run out); false
    // when it holds none. Not allowed while a plan is in flight.
    bool preempt(int64_t rid);

    // Plans the next step; one call per step, then update(). Throws
    // std::logic_error when the previous plan was not updated.
    StepPlan schedule();
    // Commits the planned step with one sampled token per sample row, in plan
    // order. Returns one event per sampled row (plus pending abort events).
    std::vector<StepEvent> update(std::span<const int32_t> sampled);

    Allocation allocation(int64_t rid) const;  // slot and pages held now; throws for an unknown rid
    Allocation handoff(int64_t rid) const;     // a PROMPT engine's finished request
    void release_handoff(int64_t rid);

    const SchedulerConfig &config() const { return config_; }
    int32_t num_waiting() const;  // queued, not holding a slot
    int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
    int32_t num_handoff() const;
    int32_t num_requests() const { return static_cast<int32_t>(requests_.size()); }
    bool has_unfinished() const { return !queue_.empty() || !running_.empty(); }
    int64_t num_preemptions() const { return num_preemptions_; }
    int64_t num_replayed_tokens() const { return num_replayed_; }
    const SlotPool &slots() const { return slots_; }
    const PrefixCache &cache() const { return cache_; }

private:
    struct Planned {
        int64_t rid;
        uint64_t serial;
        int32_t end;
        bool sample;
    };

    Request &create(int64_t rid, std::span<const int32_t> prompt, std::span<const int32_t> output,
                    const StopParams &stop, const char *where);
    Request *find(int64_t rid) const;
    bool admit(Request &r);
    void release_resources(Request &r);
    void unadmit(Request &r);
    void forget(Request &r, bool defer_release);
    int32_t reachable_end(const Request &r, int32_t want) const;
    void grow(Request &r, int32_t end);
    Request *victim(uint64_t admitted_after) const;
    bool make_room(Request &r, int32_t end, uint64_t admitted_after);
    void preempt_now(Request &r);
    void requeue_preempted();
    void plan_decodes(std::vector<Chunk> &chunks, int32_t &budget);
    void plan_prefills(std::vector<Chunk> &chunks, int32_t &budget);
    void settle_pages(Request &r);
    std::string stop_reason(const Request &r) const;
    void commit(const Planned &p, std::span<const int32_t> sampled, size_t &next,
                std::vector<StepEvent> &out);
    void check_sampled(std::span<const int32_t> sampled) const;

    SchedulerConfig config_;
    BucketTable buckets_;
    SlotPool slots_;
    PrefixCache cache_;
    std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
    std::deque<Request *> queue_;     // needs prefill, FCFS
    std::vector<Request *> running_;  // holds a slot and runs, in admission order
    std::vector<Request *> preempted_;
    std::vector<std::unique_ptr<Request>> dropped_;  // aborted while planned: freed by update()
    std::vector<Planned> in_flight_;
    bool has_plan_ = false;
    int64_t step_ = 0;
    uint64_t next_serial_ = 0;
    uint64_t next_admission_ = 0;
    int64_t num_preemptions_ = 0;
    int64_t num_replayed_ = 0;
    std::vector<StepEvent> pending_;
};

}  // namespace dsgraph
