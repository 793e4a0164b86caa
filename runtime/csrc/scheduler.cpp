// Planning half of the scheduler: admission, page growth, preemption and the
// two phases of schedule(). Requests, update() and hand-off are in
// scheduler_requests.cpp.
#include "scheduler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsgraph {
namespace {

int32_t lcm_of(const std::vector<int32_t> &ratios) {
    int32_t out = 1;
    for (const int32_t r : ratios) {
        out = std::lcm(out, r);
    }
    return out;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, std::shared_ptr<ThroughputCurve> curve)
    // Validated before any member is built from it, so errors name config fields.
    : config_((validate_config(config), std::move(config))),
      curve_(std::move(curve)),
      buckets_(config_.buckets),
      slots_(config_.num_slots),
      cache_(config_.page_size, config_.ratios, config_.num_pages) {
    if (config_.verify_mode == VerifyMode::kConfidence && curve_ == nullptr) {
        throw std::invalid_argument(
            "Scheduler: SchedulerConfig.verify_mode = CONFIDENCE needs a throughput curve; got none");
    }
}

bool Scheduler::admit(Request &r) {
    const std::optional<int32_t> slot = slots_.allocate();
    if (!slot) {
        return false;
    }
    r.slot = *slot;
    r.admitted_at = ++next_admission_;
    r.pages.assign(config_.ratios.size(), {});
    r.num_computed = 0;
    r.replay_end = 0;
    r.window_start = 0;
    if (config_.enable_prefix_cache && r.use_prefix_cache) {
        if (r.chain.empty()) {
            r.chain = cache_.chains(std::span(r.tokens).first(static_cast<size_t>(r.prompt_len)));
        }
        const int64_t hit = cache_.match(r.chain);
        r.pages = cache_.acquire(r.chain, hit);
        // Start early enough to rebuild the SWA state, on a group boundary of
        // every ratio (no compressor state to restore), and leave at least the
        // newest token to compute so the step samples it.
        int64_t start =
            std::min<int64_t>(std::max<int64_t>(hit - config_.replay_tokens, 0), r.num_tokens() - 1);
        start -= start % lcm_of(config_.ratios);
        r.num_computed = static_cast<int32_t>(start);
        r.replay_end = static_cast<int32_t>(hit);
        // The slot's ring holds no key of this request below `start` (a reused slot holds another
        // request's): attention must not read SWA keys there, for this and every later step.
        r.window_start = static_cast<int32_t>(start);
    }
    r.num_settled.assign(config_.ratios.size(), 0);
    for (size_t i = 0; i < r.pages.size(); ++i) {
        r.num_settled[i] = static_cast<int32_t>(r.pages[i].size());
    }
    running_.push_back(&r);
    return true;
}

void Scheduler::release_resources(Request &r) {
    for (size_t i = 0; i < r.pages.size(); ++i) {
        // Last page first: in the idle LRU a chain's tail is then evicted before its head.
        for (auto it = r.pages[i].rbegin(); it != r.pages[i].rend(); ++it) {
            cache_.release(i, *it);
        }
        r.pages[i].clear();
    }
    if (r.slot >= 0) {
        slots_.release(r.slot);
        r.slot = -1;
    }
}

void Scheduler::unadmit(Request &r) {
    release_resources(r);
    std::erase(running_, &r);
    r.num_computed = 0;
    r.replay_end = 0;
    r.window_start = 0;
    r.admitted_at = 0;
    r.num_settled.clear();
    // The caches are given up: the next admission recomputes and samples the newest token again.
    r.drafts.clear();
    r.confidence.clear();
}

int32_t Scheduler::reachable_end(const Request &r, int32_t want) const {
    int64_t end = want;
    for (size_t i = 0; i < config_.ratios.size(); ++i) {
        // k pages hold k * page_size entries: tokens up to (k * page_size + 1) * r - 1.
        const int64_t k = static_cast<int64_t>(r.pages[i].size()) + cache_.num_available(i);
        end = std::min(end, (k * config_.page_size + 1) * config_.ratios[i] - 1);
    }
    return static_cast<int32_t>(end);
}

void Scheduler::grow(Request &r, int32_t end) {
    for (size_t i = 0; i < config_.ratios.size(); ++i) {
        const size_t need = static_cast<size_t>(pages_needed(end, config_.ratios[i], config_.page_size));
        while (r.pages[i].size() < need) {
            const std::optional<int32_t> page = cache_.allocate(i);
            if (!page) {  // reachable_end() said these pages exist
                throw std::logic_error("Scheduler: no page of ratio " + std::to_string(config_.ratios[i]) +
                                       " for request " + std::to_string(r.rid));
            }
            r.pages[i].push_back(*page);
        }
    }
}

Request *Scheduler::victim(uint64_t admitted_after) const {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        // Not in this plan, nor in a step still running (overlapped scheduling): its caches are free to go.
        if ((*it)->planned_in != static_cast<uint64_t>(step_) && (*it)->last_planned <= done_step_) {
            return (*it)->admitted_at > admitted_after ? *it : nullptr;
        }
    }
    return nullptr;
}

bool Scheduler::make_room(Request &r, int32_t end, uint64_t admitted_after) {
    while (reachable_end(r, end) < end) {
        Request *v = victim(admitted_after);
        if (v == nullptr) {
            return false;
        }
        preempt_now(*v);
        if (v == &r) {
            return false;
        }
    }
    return true;
}

void Scheduler::preempt_now(Request &r) {
    ++num_preemptions_;
    if (config_.engine_type == EngineType::kCompletion) {
        pending_.push_back({r.rid, -1, true, "abort"});
        forget(r);
        return;
    }
    unadmit(r);
    std::erase(queue_, &r);
    preempted_.push_back(&r);
}

void Scheduler::requeue_preempted() {
    // Back to the front in arrival order, ahead of requests never admitted.
    std::sort(preempted_.begin(), preempted_.end(),
              [](const Request *a, const Request *b) { return a->serial > b->serial; });
    for (Request *r : preempted_) {
        queue_.push_front(r);
    }
    preempted_.clear();
}

void Scheduler::plan_decodes(std::vector<Chunk> &chunks, int32_t &budget) {
    // Indexing, not iterators: preemption removes requests from the back.
    for (size_t k = 0; k < running_.size(); ++k) {
        Request &r = *running_[k];
        if (!r.decoding()) {
            continue;
        }
        const int32_t end = r.num_computed + 1;
        if (!make_room(r, end, 0)) {
            continue;  // r itself was the victim
        }
        grow(r, end);
        r.planned_in = static_cast<uint64_t>(step_);
        chunks.push_back({&r, r.num_computed, end, true});
        --budget;
    }
}

void Scheduler::plan_prefills(std::vector<Chunk> &chunks, int32_t &budget) {
    const std::vector<Request *> order(queue_.begin(), queue_.end());
    for (Request *rp : order) {
        Request &r = *rp;
        if (r.planned_in == static_cast<uint64_t>(step_) ||
            std::find(preempted_.begin(), preempted_.end(), rp) != preempted_.end()) {
            continue;  // its last token went in as a decode row, or it gave its pages up this step
        }
        const bool fresh = !r.admitted();
        if (budget <= 0 || (fresh && (num_running() >= config_.max_num_seqs || !admit(r)))) {
            break;
        }
        // Only requests admitted after this one may be preempted for it.
        if (!make_room(r, r.num_computed + 1, r.admitted_at)) {
            if (fresh) {
                unadmit(r);
            }
            break;  // FCFS: nobody overtakes a request that cannot progress
        }
        if (fresh && config_.enable_prefix_cache && r.use_prefix_cache) {
            cache_.count_lookup(r.prompt_len, r.replay_end);
        }
        const int32_t step_cap = r.max_chunk > 0 ? std::min(budget, r.max_chunk) : budget;
        const int32_t end = reachable_end(r, std::min(r.num_tokens(), r.num_computed + step_cap));
        grow(r, end);
        r.planned_in = static_cast<uint64_t>(step_);
        chunks.push_back({&r, r.num_computed, end, end == r.num_tokens()});
        budget -= end - r.num_computed;
        num_replayed_ += std::max(0, std::min(end, r.replay_end) - r.num_computed);
    }
}

StepPlan Scheduler::schedule() {
    if (has_plan_) {
        throw std::logic_error("Scheduler.schedule: the plan of step " + std::to_string(step_) +
                               " was not committed; call update() before planning the next step");
    }
    ++step_;
    std::vector<Chunk> chunks;
    int32_t budget = config_.max_num_batched_tokens;
    if (config_.engine_type != EngineType::kPrompt) {
        plan_decodes(chunks, budget);
    }
    const size_t num_decode = chunks.size();
    if (config_.engine_type != EngineType::kCompletion) {
        plan_prefills(chunks, budget);
    }
    VerifyPlan verify;
    if (config_.verify_mode != VerifyMode::kOff) {
        const int64_t prefill_rows =
            config_.max_num_batched_tokens - budget - static_cast<int64_t>(num_decode);
        verify = plan_drafts(chunks, num_decode, budget, prefill_rows);
    }
    StepPlan plan = build_plan(chunks, config_, buckets_);
    plan.step = step_;
    plan.num_decode = static_cast<int32_t>(num_decode);
    plan.expected_tokens = verify.expected_tokens;
    plan.predicted_ms = verify.step_ms;
    for (const Request *r : preempted_) {
        plan.preempted.push_back(r->rid);
    }
    requeue_preempted();
    in_flight_.clear();
    for (size_t s = 0; s < chunks.size(); ++s) {
        const Chunk &c = chunks[s];
        find(c.request->rid)->last_planned = step_;
        in_flight_.push_back(
            {c.request->rid, c.request->serial, c.end, c.sample, c.drafts, plan.verify_start[s]});
    }
    has_plan_ = true;
    return plan;
}

}  // namespace dsgraph
