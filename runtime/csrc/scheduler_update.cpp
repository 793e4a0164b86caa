// Committing a step: update() advances the planned requests, appends sampled
// tokens, checks stop conditions and offers full prompt pages to the prefix
// cache. Also the read-only views of requests (allocation, hand-off).
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "scheduler.h"

namespace dsgraph {

std::vector<StepEvent> Scheduler::update(std::span<const int32_t> sampled) {
    return update(StepCommit{sampled, {}, {}, {}, {}});
}

std::vector<StepEvent> Scheduler::update(const StepCommit &c) {
    if (!has_plan_) {
        throw std::logic_error("Scheduler.update: no plan in flight; call schedule() first");
    }
    if (has_unresolved()) {
        throw std::logic_error("Scheduler.update: step " + std::to_string(unresolved_step_) +
                               " awaits its tokens; call resolve() before committing step " +
                               std::to_string(step_));
    }
    check_commit(c);  // before any change, so a rejected call can be retried
    has_plan_ = false;
    done_step_ = step_;
    release_dropped();
    std::vector<StepEvent> events = std::move(pending_);
    pending_.clear();
    for (size_t s = 0; s < in_flight_.size(); ++s) {
        commit(in_flight_[s], c, s, events);
    }
    in_flight_.clear();
    return events;
}

int32_t Scheduler::emitted_by(const StepCommit &c, size_t seq) const {
    if (c.num_emitted.empty()) {
        return in_flight_[seq].sample ? 1 : 0;
    }
    return c.num_emitted[seq];
}

void Scheduler::commit(const Planned &p, const StepCommit &c, size_t seq, std::vector<StepEvent> &out) {
    Request *r = find(p.rid);
    if (r == nullptr || r->serial != p.serial) {
        return;  // aborted after planning
    }
    const int32_t emitted = emitted_by(c, seq);
    r->planned_in = 0;
    // Rows of the emitted prefix hold committed tokens (the newest, then accepted drafts): their cache
    // entries stay; rows of rejected drafts are past num_computed and are overwritten later.
    r->num_computed = p.end - p.drafts + std::max(emitted - 1, 0);
    settle_pages(*r);
    if (!p.sample) {
        return;
    }
    std::erase(queue_, r);  // a sampled chunk ends the prefill
    std::string reason;
    for (int32_t j = 0; j < emitted && reason.empty(); ++j) {
        const int32_t token = c.sampled[static_cast<size_t>(p.first_row + j)];
        r->tokens.push_back(token);
        reason = stop_reason(*r);  // tokens after a stop are discarded
        if (reason.empty() && config_.engine_type == EngineType::kPrompt) {
            reason = "prefilled";
        }
        out.push_back({r->rid, token, !reason.empty(), reason});
    }
    if (reason == "prefilled") {
        r->handed_off = true;
        std::erase(running_, r);
    } else if (!reason.empty()) {
        forget(*r);
    } else {
        store_drafts(*r, c, seq);
        if (p.drafts > 0) {
            trim_pages(*r);
        }
    }
}

void Scheduler::settle_pages(Request &r) {
    if (!config_.enable_prefix_cache || r.chain.empty()) {
        return;
    }
    const int64_t done = std::min(r.num_computed, r.prompt_len);
    for (size_t i = 0; i < config_.ratios.size(); ++i) {
        const int64_t full = done / cache_.tokens_per_page(i);
        for (int32_t &n = r.num_settled[i]; n < full; ++n) {
            // false when another request cached this prefix first: the page stays private.
            cache_.insert(i, r.chain[i][static_cast<size_t>(n)], r.pages[i][static_cast<size_t>(n)]);
        }
    }
}

std::string Scheduler::stop_reason(const Request &r) const {
    const int32_t token = r.tokens.back();
    const std::vector<int32_t> &stops = r.stop.stop_token_ids;
    if ((!r.stop.ignore_eos && r.stop.eos_id >= 0 && token == r.stop.eos_id) ||
        std::find(stops.begin(), stops.end(), token) != stops.end()) {
        return "stop";
    }
    if (r.num_outputs() >= r.stop.max_tokens || r.num_tokens() >= config_.max_model_len) {
        return "length";
    }
    return "";
}

Allocation Scheduler::allocation(int64_t rid) const {
    const Request *r = find(rid);
    if (r == nullptr) {
        throw std::invalid_argument("Scheduler.allocation: rid = " + std::to_string(rid) +
                                    " is not an unfinished request");
    }
    return {r->rid, r->slot, r->pages, r->num_computed, r->tokens};
}

Allocation Scheduler::handoff(int64_t rid) const {
    const Request *r = find(rid);
    if (r == nullptr || !r->handed_off) {
        throw std::invalid_argument("Scheduler.handoff: rid = " + std::to_string(rid) +
                                    " has no finished prompt waiting for hand-off");
    }
    return allocation(rid);
}

void Scheduler::release_handoff(int64_t rid) {
    handoff(rid);  // same check and message
    forget(*find(rid));
}

int32_t Scheduler::num_waiting() const {
    return static_cast<int32_t>(
        std::count_if(queue_.begin(), queue_.end(), [](const Request *r) { return !r->admitted(); }));
}

int32_t Scheduler::num_handoff() const {
    return static_cast<int32_t>(std::count_if(requests_.begin(), requests_.end(),
                                              [](const auto &kv) { return kv.second->handed_off; }));
}

}  // namespace dsgraph
