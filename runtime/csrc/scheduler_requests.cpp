// Request half of the scheduler: adding (with validation), abort, preemption
// on demand, update() and PROMPT-engine hand-off. Planning is in scheduler.cpp.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler.h"

namespace dsgraph {
namespace {

std::string token_error(const char *where, const char *field, size_t index, int32_t value, int32_t vocab) {
    return std::string(where) + ": " + field + "[" + std::to_string(index) + "] = " + std::to_string(value) +
           " is not a token id; expected 0 <= id" + (vocab > 0 ? " < " + std::to_string(vocab) : "");
}

void check_tokens(const char *where, const char *field, std::span<const int32_t> ids, int32_t vocab) {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab)) {
            throw std::invalid_argument(token_error(where, field, i, ids[i], vocab));
        }
    }
}

void check_stop(const char *where, const StopParams &stop, int32_t vocab) {
    const std::string w = std::string(where) + ": ";
    if (stop.max_tokens < 1) {
        throw std::invalid_argument(w + "max_tokens = " + std::to_string(stop.max_tokens) +
                                    "; expected >= 1");
    }
    if (stop.eos_id < -1 || (vocab > 0 && stop.eos_id >= vocab)) {
        throw std::invalid_argument(w + "eos_id = " + std::to_string(stop.eos_id) +
                                    "; expected -1 (none) or a token id");
    }
    check_tokens(where, "stop_token_ids", stop.stop_token_ids, vocab);
}

}  // namespace

Request *Scheduler::find(int64_t rid) const {
    const auto it = requests_.find(rid);
    return it == requests_.end() ? nullptr : it->second.get();
}

Request &Scheduler::create(int64_t rid, std::span<const int32_t> prompt, std::span<const int32_t> output,
                           const StopParams &stop, const char *where) {
    const std::string w = std::string(where) + ": ";
    if (find(rid) != nullptr) {
        throw std::invalid_argument(w + "rid = " + std::to_string(rid) + " is already in use");
    }
    if (prompt.empty()) {
        throw std::invalid_argument(w + "prompt is empty; expected at least one token");
    }
    if (prompt.size() > static_cast<size_t>(config_.max_model_len)) {
        throw std::invalid_argument(
            w + "prompt has " + std::to_string(prompt.size()) +
            " tokens, longer than max_model_len = " + std::to_string(config_.max_model_len));
    }
    check_tokens(where, "prompt", prompt, config_.vocab_size);
    check_tokens(where, "output", output, config_.vocab_size);
    check_stop(where, stop, config_.vocab_size);
    // Rows ever fed: every token but the last output, within max_model_len.
    const int64_t fed =
        std::min<int64_t>(static_cast<int64_t>(prompt.size()) + stop.max_tokens - 1, config_.max_model_len);
    for (size_t i = 0; i < config_.ratios.size(); ++i) {
        const int32_t need = pages_needed(fed, config_.ratios[i], config_.page_size);
        if (need > config_.num_pages[i]) {
            throw std::invalid_argument(w + "the request can need " + std::to_string(need) +
                                        " pages of ratio " + std::to_string(config_.ratios[i]) +
                                        " (prompt + max_tokens), but " + "the pool has " +
                                        std::to_string(config_.num_pages[i]));
        }
    }
    auto r = std::make_unique<Request>();
    r->rid = rid;
    r->serial = ++next_serial_;
    r->tokens.assign(prompt.begin(), prompt.end());
    r->tokens.insert(r->tokens.end(), output.begin(), output.end());
    r->prompt_len = static_cast<int32_t>(prompt.size());
    r->stop = stop;
    r->pages.assign(config_.ratios.size(), {});
    Request &out = *r;
    requests_.emplace(rid, std::move(r));
    return out;
}

void Scheduler::add_request(int64_t rid, std::span<const int32_t> prompt, const StopParams &stop,
                            bool use_prefix_cache, int32_t max_chunk) {
    if (config_.engine_type == EngineType::kCompletion) {
        throw std::invalid_argument("add_request: a COMPLETION engine only decodes; use add_prefilled()");
    }
    if (max_chunk < 0) {
        throw std::invalid_argument("add_request: max_chunk " + std::to_string(max_chunk) +
                                    ", expected >= 0 (0: no limit)");
    }
    Request &r = create(rid, prompt, {}, stop, "add_request");
    r.use_prefix_cache = use_prefix_cache;
    r.max_chunk = max_chunk;
    queue_.push_back(&r);
}

bool Scheduler::can_add_prefilled(int32_t num_tokens) const {
    if (slots_.num_free() == 0 || num_running() >= config_.max_num_seqs) {
        return false;
    }
    for (size_t i = 0; i < config_.ratios.size(); ++i) {
        if (pages_needed(num_tokens, config_.ratios[i], config_.page_size) > cache_.num_available(i)) {
            return false;
        }
    }
    return true;
}

Allocation Scheduler::add_prefilled(int64_t rid, std::span<const int32_t> prompt,
                                    std::span<const int32_t> output, const StopParams &stop) {
    const char *where = "add_prefilled";
    if (config_.engine_type == EngineType::kPrompt) {
        throw std::invalid_argument("add_prefilled: a PROMPT engine does not decode; use add_request()");
    }
    check_stop(where, stop, config_.vocab_size);
    const size_t total = prompt.size() + output.size();
    if (output.empty() || output.size() >= static_cast<size_t>(stop.max_tokens) ||
        total >= static_cast<size_t>(config_.max_model_len)) {
        throw std::invalid_argument(
            "add_prefilled: output has " + std::to_string(output.size()) + " tokens and prompt + output " +
            std::to_string(total) +
            "; expected 1 <= len(output) < max_tokens = " + std::to_string(stop.max_tokens) +
            " and prompt + output < max_model_len = " + std::to_string(config_.max_model_len));
    }
    const int32_t cached = static_cast<int32_t>(total) - 1;
    if (!can_add_prefilled(cached)) {
        throw std::runtime_error("add_prefilled: no room for request " + std::to_string(rid) +
                                 " (a free slot below max_num_seqs and pages for " + std::to_string(cached) +
                                 " tokens); check can_add_prefilled() first");
    }
    Request &r = create(rid, prompt, output, stop, where);
    r.slot = *slots_.allocate();
    r.admitted_at = ++next_admission_;
    r.pages.assign(config_.ratios.size(), {});
    grow(r, cached);
    r.num_computed = cached;
    running_.push_back(&r);
    return allocation(rid);
}

void Scheduler::forget(Request &r) {
    std::erase(queue_, &r);
    std::erase(running_, &r);
    r.gone = true;
    auto node = requests_.extract(r.rid);
    if (r.last_planned > done_step_) {
        dropped_.push_back(std::move(node.mapped()));  // a step not done yet still writes its caches
    } else {
        release_resources(r);
    }
}

void Scheduler::release_dropped() {
    std::erase_if(dropped_, [this](const std::unique_ptr<Request> &r) {
        if (r->last_planned > done_step_) {
            return false;
        }
        release_resources(*r);
        return true;
    });
}

bool Scheduler::abort(int64_t rid) {
    Request *r = find(rid);
    if (r == nullptr) {
        return false;
    }
    if (!r->handed_off) {
        pending_.push_back({rid, -1, true, "abort"});
    }
    r->aborted = true;
    forget(*r);
    return true;
}

bool Scheduler::preempt(int64_t rid) {
    if (has_plan_ || has_unresolved()) {
        throw std::logic_error("Scheduler.preempt: a plan is in flight; call update() (or resolve()) first");
    }
    Request *r = find(rid);
    if (r == nullptr || !r->admitted() || r->handed_off) {
        return false;
    }
    preempt_now(*r);
    requeue_preempted();
    return true;
}

}  // namespace dsgraph
