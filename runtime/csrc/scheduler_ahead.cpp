// Overlapped scheduling: committing a step before its tokens reach the host
// (commit_ahead) and writing them once they do (resolve). See scheduler.h.
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler.h"

namespace dsgraph {

void Scheduler::check_ahead(const char *where) const {
    const std::string w = std::string("Scheduler.") + where + ": ";
    if (!has_plan_) {
        throw std::logic_error(w + "no plan in flight; call schedule() first");
    }
    if (config_.verify_mode != VerifyMode::kOff || config_.engine_type == EngineType::kCompletion) {
        throw std::logic_error(w +
                               "overlapped steps need SchedulerConfig.verify_mode OFF and engine_type NORMAL "
                               "or PROMPT");
    }
}

std::pair<std::vector<StepEvent>, StepPlan> Scheduler::advance_ahead(std::span<const int32_t> sampled) {
    check_ahead("advance_ahead");
    std::vector<StepEvent> events;
    if (has_unresolved()) {
        events = resolve(sampled);
    } else if (!sampled.empty()) {
        throw std::invalid_argument("Scheduler.advance_ahead: sampled has " + std::to_string(sampled.size()) +
                                    " tokens but no step awaits its tokens; expected none");
    } else {
        events = std::move(pending_);
        pending_.clear();
    }
    commit_ahead();
    return {std::move(events), schedule()};
}

void Scheduler::commit_ahead() {
    check_ahead("commit_ahead");
    if (has_unresolved()) {
        throw std::logic_error("Scheduler.commit_ahead: step " + std::to_string(unresolved_step_) +
                               " awaits its tokens; call resolve() first");
    }
    has_plan_ = false;
    if (in_flight_.empty()) {  // an empty plan: nothing runs, nothing to wait for
        done_step_ = step_;
        release_dropped();
        return;
    }
    size_t rows = 0;
    for (const Planned &p : in_flight_) {
        rows += p.sample ? 1 : 0;
        Request *r = find(p.rid);
        if (r == nullptr || r->serial != p.serial) {
            continue;  // aborted after planning: its row is discarded
        }
        r->planned_in = 0;
        r->num_computed = p.end;
        // Full prompt pages are offered to the prefix cache now: a later plan reading them runs after
        // this step on the device.
        settle_pages(*r);
        if (!p.sample) {
            continue;
        }
        std::erase(queue_, r);  // a sampled chunk ends the prefill
        r->tokens.push_back(unresolved_token(p.first_row));
        unresolved_.push_back({r, r->tokens.size() - 1, p.first_row});
        if (r->num_outputs() >= r->stop.max_tokens || r->num_tokens() >= config_.max_model_len) {
            forget(*r);  // known now: no later plan holds it; resolve() reports its last token
        } else if (config_.engine_type == EngineType::kPrompt) {
            // its prompt is done: no later plan holds it; resolve() hands it off (or stops it)
            std::erase(running_, r);
        }
    }
    in_flight_.clear();
    unresolved_step_ = step_;
    unresolved_rows_ = rows;
}

std::vector<StepEvent> Scheduler::resolve(std::span<const int32_t> sampled) {
    if (!has_unresolved()) {
        throw std::logic_error("Scheduler.resolve: no step awaits its tokens (commit_ahead() commits one)");
    }
    if (sampled.size() != unresolved_rows_) {
        throw std::invalid_argument("Scheduler.resolve: sampled has " + std::to_string(sampled.size()) +
                                    " tokens; expected " + std::to_string(unresolved_rows_) +
                                    " (one per sample row of step " + std::to_string(unresolved_step_) + ")");
    }
    const int32_t vocab = config_.vocab_size;
    for (const Unresolved &u : unresolved_) {
        const int32_t token = sampled[static_cast<size_t>(u.row)];
        if (!u.request->aborted && (token < 0 || (vocab > 0 && token >= vocab))) {
            throw std::invalid_argument("Scheduler.resolve: sampled[" + std::to_string(u.row) +
                                        "] = " + std::to_string(token) + " is not a token id; expected 0 <= id" +
                                        (vocab > 0 ? " < " + std::to_string(vocab) : ""));
        }
    }
    std::vector<StepEvent> events = std::move(pending_);
    pending_.clear();
    for (const Unresolved &u : unresolved_) {
        Request &r = *u.request;
        const int32_t token = sampled[static_cast<size_t>(u.row)];
        r.tokens[u.index] = token;
        if (r.aborted) {
            continue;  // its abort event went out already
        }
        std::string reason = stop_reason(r);  // the newest token is this one
        if (reason.empty() && config_.engine_type == EngineType::kPrompt) {
            reason = "prefilled";
            r.handed_off = true;  // slot and pages stay held for handoff()
        }
        events.push_back({r.rid, token, !reason.empty(), reason});
        if (!reason.empty() && reason != "prefilled" && !r.gone) {
            forget(r);
        }
    }
    unresolved_.clear();
    done_step_ = unresolved_step_;
    unresolved_step_ = 0;
    unresolved_rows_ = 0;
    release_dropped();
    return events;
}

}  // namespace dsgraph
