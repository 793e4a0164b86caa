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
// Speculative decoding (verify_mode CONFIDENCE or FIXED): a commit may store
// drafts (and confidences) per sequence for the tokens after the newest one. A
// decoding request holding drafts is planned as the rows [newest token, d_0 ..
// d_{k-1}] at positions a..a+k; every one of them is sampled (verify_start /
// verify_len). k is chosen after the prefill chunks, from the budget they
// leave: the confidence planner (spec_schedule.h plan_verification, other_rows
// = the step's prefill rows) or fixed mode, each request capped by its pages
// (drafts never preempt), max_tokens and max_model_len. The commit of a verify
// sequence takes 1..k+1 emitted tokens (the accepted drafts then the target's
// token), stops at the first stop condition (the rest is discarded), keeps
// the cache entries of the emitted prefix only and returns the pages past it.
//
// Overlapped scheduling (zero-overhead: the next step is planned while this
// one runs). commit_ahead() commits the plan in flight before its tokens are
// known: each sampling sequence gets an unresolved newest token (request.h),
// the length limits are applied (max_tokens and max_model_len are known in
// advance), and the next schedule() plans decode rows after it (StepPlan
// token_src names the sample row the device copies the token from). resolve()
// then takes the step's tokens: it writes them, checks eos and stop tokens, and
// returns the step's events. A request that stopped or was aborted while a
// later step is planned or running loses that step's rows (its tokens are
// discarded) and keeps its slot and pages until every step that holds it is
// done (resolved or committed): nothing a running step writes is reused early.
// A preemption victim is never a request of a step that is not done. Overlap
// needs verify_mode OFF and a NORMAL or PROMPT engine (DSpark steps are not
// overlapped). On a PROMPT engine a request whose prompt is done leaves the
// running set at commit_ahead() and resolve() finishes it "prefilled" (held for
// handoff()) unless its token stops it.
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
#include <utility>
#include <vector>

#include "buckets.h"
#include "prefix_cache.h"
#include "request.h"
#include "scheduler_config.h"
#include "slot_pool.h"
#include "spec_curve.h"
#include "spec_schedule.h"
#include "step_plan.h"

namespace dsgraph {

struct StepEvent {
    int64_t rid;
    int32_t token;  // -1 when no token comes with the event (abort)
    bool finished;
    std::string reason;  // empty unless finished
};

// What a step's commit carries. sampled: one token per sample row of the plan
// (rows a sequence does not emit are ignored). num_emitted: per plan sequence,
// the tokens it emits: 0 for a chunk that samples nothing, 1..verify_len for
// the others (the first num_emitted of its sample rows; all but the last must
// equal the drafts in those rows); empty: 1 per sampling sequence. drafts
// [seqs, nextn] row-major with draft_lengths [seqs] (0..nextn) and optional
// confidence [seqs, nextn] (conditional probabilities in [0, 1]; required in
// CONFIDENCE mode when a sequence holds drafts): each sampling sequence's
// drafts for the tokens after its new newest token; empty: none.
struct StepCommit {
    std::span<const int32_t> sampled;
    std::span<const int32_t> num_emitted;
    std::span<const int32_t> drafts;
    std::span<const int32_t> draft_lengths;
    std::span<const double> confidence;
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
    // curve: the throughput curve of the confidence planner (required in
    // CONFIDENCE mode; FIXED mode uses it, when given, to cap the step's rows).
    // Shared so that the caller's online corrections (observe) reach the planner.
    explicit Scheduler(SchedulerConfig config, std::shared_ptr<ThroughputCurve> curve = nullptr);
    Scheduler(const Scheduler &) = delete;  // requests point into each other's queues
    Scheduler &operator=(const Scheduler &) = delete;

    // Queues a request (NORMAL, PROMPT). Throws std::invalid_argument naming the
    // field: rid in use, empty prompt, prompt longer than max_model_len, a token
    // id < 0 (or >= vocab_size), max_tokens < 1, a stop token id < 0.
    // use_prefix_cache false: this request neither reads nor fills the prefix cache.
    // max_chunk > 0: no step prefills more than that many of its tokens (< 0 throws).
    void add_request(int64_t rid, std::span<const int32_t> prompt, const StopParams &stop,
                     bool use_prefix_cache = true, int32_t max_chunk = 0);
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
    // Commits the planned step with emitted tokens per sequence and the next
    // drafts (StepCommit). Validates everything before changing anything; the
    // events are one per emitted token, in plan order.
    std::vector<StepEvent> update(const StepCommit &commit);
    // Overlapped scheduling (see the top of this file): commits the plan in flight with its tokens still
    // unknown. Throws std::logic_error without a plan, while a step awaits resolve(), or with verify_mode
    // other than OFF or an engine other than NORMAL. An empty plan leaves nothing to resolve.
    void commit_ahead();
    // The tokens of the step commit_ahead() committed, one per sample row of its plan: writes them,
    // checks stop conditions, frees what waited for that step. Returns pending aborts then one event per
    // emitted token. Validates before changing anything; throws std::logic_error when no step awaits.
    std::vector<StepEvent> resolve(std::span<const int32_t> sampled);
    // The engine's one crossing per overlapped step: resolve() the step awaiting its tokens (none: sampled
    // must be empty, pending aborts are returned), commit_ahead() the plan in flight, schedule() the next.
    std::pair<std::vector<StepEvent>, StepPlan> advance_ahead(std::span<const int32_t> sampled);
    bool has_unresolved() const { return unresolved_step_ != 0; }
    int64_t unresolved_step() const { return unresolved_step_; }
    int64_t done_step() const { return done_step_; }

    Allocation allocation(int64_t rid) const;  // slot and pages held now; throws for an unknown rid
    Allocation handoff(int64_t rid) const;     // a PROMPT engine's finished request
    void release_handoff(int64_t rid);

    // Store import (runtime/kvstore/prefix_import.py): blocks of a prompt's prefix computed elsewhere
    // enter the prefix cache, so the request that then arrives with this prompt (add_request) is
    // admitted with that prefix cached and prefills only the rest (plus the SWA replay of any hit).
    // prefix_pages: per ratio, the pages holding the prompt's leading full pages cached now.
    std::vector<std::vector<int32_t>> prefix_pages(std::span<const int32_t> prompt) const;
    // import_prefix: caches pages [0, counts[i]) of ratio i's chain of `prompt`: per ratio one entry per
    // page, a fresh page id (the caller writes the block's bytes into it before the next schedule()) or
    // -1 where the page is cached already. A ratio stops early at the first page that cannot be had (no
    // free or idle page). The pages end idle; none of this prompt's chain is evicted by the call itself.
    // Safe with a step planned or running: a fresh page is free or idle, so no step's rows touch it.
    std::vector<std::vector<int32_t>> import_prefix(std::span<const int32_t> prompt,
                                                    const std::vector<int32_t> &counts);

    const SchedulerConfig &config() const { return config_; }
    int32_t num_waiting() const;  // queued, not holding a slot
    int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
    int32_t num_handoff() const;
    int32_t num_requests() const { return static_cast<int32_t>(requests_.size()); }
    bool has_unfinished() const { return !queue_.empty() || !running_.empty(); }
    int64_t num_preemptions() const { return num_preemptions_; }
    int64_t num_replayed_tokens() const { return num_replayed_; }
    const SlotPool &slots() const { return slots_; }
    const ThroughputCurve *curve() const { return curve_.get(); }
    // The draft pass (ms) a drafting plan pays on top of its verify step, by draft depth (entry D - 1:
    // a pass drafting D tokens per request; the last entry covers deeper passes); a plan verifying no
    // drafts pays none (spec_schedule.h plan_verification). The engine sets it before each advance;
    // set_draft_ms sets one cost for every depth. Throws unless every entry is finite >= 0.
    void set_draft_ms(double ms);
    double draft_ms() const { return draft_ms_.empty() ? 0.0 : draft_ms_.back(); }
    void set_draft_depth_ms(std::vector<double> ms);
    const std::vector<double> &draft_depth_ms() const { return draft_ms_; }
    // Drafts a request holds now (tests and the engine's bookkeeping).
    std::vector<int32_t> drafts_of(int64_t rid) const;
    const PrefixCache &cache() const { return cache_; }

private:
    struct Planned {
        int64_t rid;
        uint64_t serial;
        int32_t end;
        bool sample;
        int32_t drafts;     // verify rows holding drafts
        int32_t first_row;  // its first sample row
    };

    Request &create(int64_t rid, std::span<const int32_t> prompt, std::span<const int32_t> output,
                    const StopParams &stop, const char *where);
    Request *find(int64_t rid) const;
    bool admit(Request &r);
    void release_resources(Request &r);
    void unadmit(Request &r);
    // Drops a finished or aborted request; its slot and pages wait for the newest step holding it.
    void forget(Request &r);
    void release_dropped();
    void check_ahead(const char *where) const;
    int32_t reachable_end(const Request &r, int32_t want) const;
    void grow(Request &r, int32_t end);
    Request *victim(uint64_t admitted_after) const;
    bool make_room(Request &r, int32_t end, uint64_t admitted_after);
    void preempt_now(Request &r);
    void requeue_preempted();
    void plan_decodes(std::vector<Chunk> &chunks, int32_t &budget);
    void plan_prefills(std::vector<Chunk> &chunks, int32_t &budget);
    VerifyPlan plan_drafts(std::vector<Chunk> &chunks, size_t num_decode, int32_t budget, int64_t other_rows);
    int32_t draft_cap(const Request &r) const;
    VerifyPlan choose_drafts(const DraftConfidences &d, int32_t budget, int64_t other_rows) const;
    void check_commit(const StepCommit &c) const;
    void check_next_drafts(const StepCommit &c) const;
    void store_drafts(Request &r, const StepCommit &c, size_t seq);
    void trim_pages(Request &r);
    void settle_pages(Request &r);
    std::string stop_reason(const Request &r) const;
    void commit(const Planned &p, const StepCommit &c, size_t seq, std::vector<StepEvent> &out);
    int32_t emitted_by(const StepCommit &c, size_t seq) const;

    SchedulerConfig config_;
    std::shared_ptr<ThroughputCurve> curve_;
    std::vector<double> draft_ms_;
    BucketTable buckets_;
    SlotPool slots_;
    PrefixCache cache_;
    std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
    std::deque<Request *> queue_;     // needs prefill, FCFS
    std::vector<Request *> running_;  // holds a slot and runs, in admission order
    std::vector<Request *> preempted_;
    // Forgotten while a step holding them is not done: freed once done_step_ reaches last_planned.
    std::vector<std::unique_ptr<Request>> dropped_;
    struct Unresolved {
        Request *request;  // alive: a request with an unresolved token is dropped, not freed, until then
        size_t index;      // of the token in request->tokens
        int32_t row;       // its sample row
    };
    std::vector<Unresolved> unresolved_;
    int64_t unresolved_step_ = 0;  // the step commit_ahead() committed and resolve() awaits (0: none)
    size_t unresolved_rows_ = 0;
    int64_t done_step_ = 0;  // every step up to it has run and is committed with its tokens
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
