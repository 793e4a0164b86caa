// Speculative-decoding half of the scheduler: choosing each decode request's
// verify rows (after the prefill chunks, from the budget they leave), the
// validation of a step's commit, storing the next drafts, and returning the
// pages of rejected rows. Planning is in scheduler.cpp, the commit loop in
// scheduler_update.cpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scheduler.h"

namespace dsgraph {
namespace {

std::string at_seq(const char *field, size_t seq, int64_t rid) {
    return std::string("Scheduler.update: ") + field + "[" + std::to_string(seq) + "] (request " +
           std::to_string(rid) + ")";
}

}  // namespace

int32_t Scheduler::draft_cap(const Request &r) const {
    // Verify rows write positions a..a+k (a = num_tokens - 1), all below max_model_len; the sequence
    // emits at most k + 1 tokens, so drafts past the request's last output are never worth a row.
    int64_t cap = static_cast<int64_t>(r.drafts.size());
    cap = std::min<int64_t>(cap, config_.max_model_len - r.num_tokens());
    cap = std::min<int64_t>(cap, r.stop.max_tokens - r.num_outputs() - 1);
    return static_cast<int32_t>(std::max<int64_t>(cap, 0));
}

VerifyPlan Scheduler::choose_drafts(const DraftConfidences &d, int32_t budget, int64_t other_rows) const {
    const bool fits = curve_ != nullptr && d.num_requests() + other_rows <= curve_->largest();
    if (config_.verify_mode == VerifyMode::kFixed) {
        return plan_fixed(d, config_.draft_len, fits ? curve_.get() : nullptr, budget, other_rows);
    }
    if (!fits) {  // the mandatory rows already fill the profiled sizes: no room to verify anything
        return plan_fixed(d, 0, nullptr, budget, other_rows);
    }
    return plan_verification(d, *curve_, budget, other_rows, 0.0, draft_ms_);
}

void Scheduler::set_draft_ms(double ms) {
    if (!(std::isfinite(ms) && ms >= 0.0)) {
        throw std::invalid_argument("Scheduler.draft_ms = " + std::to_string(ms) +
                                    "; expected a finite draft pass time in ms >= 0");
    }
    draft_ms_.assign(1, ms);
}

void Scheduler::set_draft_depth_ms(std::vector<double> ms) {
    for (size_t k = 0; k < ms.size(); ++k) {
        if (!(std::isfinite(ms[k]) && ms[k] >= 0.0)) {
            throw std::invalid_argument("Scheduler.draft_depth_ms[" + std::to_string(k) +
                                        "] = " + std::to_string(ms[k]) +
                                        "; expected a finite draft pass time in ms >= 0");
        }
    }
    draft_ms_ = std::move(ms);
}

VerifyPlan Scheduler::plan_drafts(std::vector<Chunk> &chunks, size_t num_decode, int32_t budget,
                                  int64_t other_rows) {
    const int64_t nextn = config_.nextn;
    std::vector<int32_t> lengths(num_decode, 0);
    std::vector<double> conf(num_decode * static_cast<size_t>(nextn), 0.0);
    bool has_conf = true;
    for (size_t i = 0; i < num_decode; ++i) {
        const Request &r = *chunks[i].request;
        lengths[i] = draft_cap(r);
        has_conf = has_conf && (lengths[i] == 0 || !r.confidence.empty());
        const size_t n = std::min(r.confidence.size(), static_cast<size_t>(lengths[i]));
        std::copy_n(r.confidence.begin(), n, conf.begin() + static_cast<std::ptrdiff_t>(i * nextn));
    }
    const DraftConfidences d{has_conf ? std::span<const double>(conf) : std::span<const double>(), lengths,
                             nextn};
    VerifyPlan verify = choose_drafts(d, std::max(budget, 0), other_rows);
    for (size_t i = 0; i < num_decode; ++i) {
        Chunk &c = chunks[i];
        Request &r = *find(c.request->rid);
        const int32_t first = c.start + 1;
        // Drafts never preempt: a request verifies only the drafts the free pages hold.
        const int32_t k = std::min(verify.drafts[i], reachable_end(r, first + verify.drafts[i]) - first);
        if (k > 0) {
            grow(r, first + k);
            c.end = first + k;
            c.drafts = k;
        }
    }
    return verify;
}

void Scheduler::check_commit(const StepCommit &c) const {
    size_t rows = 0;
    for (const Planned &p : in_flight_) {
        rows += p.sample ? static_cast<size_t>(1 + p.drafts) : 0;
    }
    if (c.sampled.size() != rows) {
        throw std::invalid_argument("Scheduler.update: sampled has " + std::to_string(c.sampled.size()) +
                                    " tokens; expected " + std::to_string(rows) +
                                    " (one per sample row of step " + std::to_string(step_) + ")");
    }
    if (!c.num_emitted.empty() && c.num_emitted.size() != in_flight_.size()) {
        throw std::invalid_argument("Scheduler.update: num_emitted has " +
                                    std::to_string(c.num_emitted.size()) +
                                    " entries; expected one per sequence of step " + std::to_string(step_) +
                                    " (" + std::to_string(in_flight_.size()) + ")");
    }
    const int32_t vocab = config_.vocab_size;
    for (size_t s = 0; s < in_flight_.size(); ++s) {
        const Planned &p = in_flight_[s];
        const Request *r = find(p.rid);
        const bool live = r != nullptr && r->serial == p.serial;
        const int32_t m = emitted_by(c, s);
        const int32_t most = p.sample ? 1 + p.drafts : 0;
        // An aborted request's rows may emit nothing; a live sampling sequence emits at least one token.
        const int32_t least = p.sample && live ? 1 : 0;
        if (m < least || m > most) {
            throw std::invalid_argument(at_seq("num_emitted", s, p.rid) + " = " + std::to_string(m) +
                                        "; expected " + std::to_string(least) + ".." + std::to_string(most) +
                                        " (its sample rows)");
        }
        for (int32_t j = 0; j < m; ++j) {
            const size_t row = static_cast<size_t>(p.first_row + j);
            const int32_t token = c.sampled[row];
            if (token < 0 || (vocab > 0 && token >= vocab)) {
                // Never dropped silently: a bad id means the sampler or the caller is broken.
                throw std::invalid_argument("Scheduler.update: sampled[" + std::to_string(row) + "] = " +
                                            std::to_string(token) + " is not a token id; expected 0 <= id" +
                                            (vocab > 0 ? " < " + std::to_string(vocab) : ""));
            }
            // The caches hold the verify rows' tokens: an emitted prefix must be the drafts it accepted.
            if (live && j + 1 < m && token != r->drafts[static_cast<size_t>(j)]) {
                throw std::invalid_argument("Scheduler.update: sampled[" + std::to_string(row) + "] = " +
                                            std::to_string(token) + " (request " + std::to_string(p.rid) +
                                            ") is followed by more emitted tokens, so it must be the draft " +
                                            std::to_string(r->drafts[static_cast<size_t>(j)]) +
                                            " it accepted");
            }
        }
    }
    check_next_drafts(c);
}

void Scheduler::check_next_drafts(const StepCommit &c) const {
    if (c.drafts.empty() && c.draft_lengths.empty() && c.confidence.empty()) {
        return;
    }
    if (config_.verify_mode == VerifyMode::kOff) {
        throw std::invalid_argument("Scheduler.update: drafts given but SchedulerConfig.verify_mode is OFF");
    }
    const size_t seqs = in_flight_.size();
    const size_t width = seqs * static_cast<size_t>(config_.nextn);
    if (c.draft_lengths.size() != seqs || c.drafts.size() != width ||
        (!c.confidence.empty() && c.confidence.size() != width)) {
        throw std::invalid_argument(
            "Scheduler.update: drafts / draft_lengths / confidence hold " + std::to_string(c.drafts.size()) +
            " / " + std::to_string(c.draft_lengths.size()) + " / " + std::to_string(c.confidence.size()) +
            " entries; expected [seqs, nextn] / [seqs] / [seqs, nextn] or none with seqs = " +
            std::to_string(seqs) + ", nextn = " + std::to_string(config_.nextn));
    }
    const int32_t vocab = config_.vocab_size;
    for (size_t s = 0; s < seqs; ++s) {
        const Planned &p = in_flight_[s];
        const int32_t len = c.draft_lengths[s];
        if (len < 0 || len > config_.nextn || (len > 0 && !p.sample)) {
            throw std::invalid_argument(at_seq("draft_lengths", s, p.rid) + " = " + std::to_string(len) +
                                        "; expected 0.." + std::to_string(p.sample ? config_.nextn : 0) +
                                        (p.sample ? "" : " (the sequence emits no token)"));
        }
        if (len > 0 && c.confidence.empty() && config_.verify_mode == VerifyMode::kConfidence) {
            throw std::invalid_argument(at_seq("draft_lengths", s, p.rid) + " = " + std::to_string(len) +
                                        " without confidence; verify_mode CONFIDENCE plans from them");
        }
        for (int32_t j = 0; j < len; ++j) {
            const size_t at = s * static_cast<size_t>(config_.nextn) + static_cast<size_t>(j);
            if (c.drafts[at] < 0 || (vocab > 0 && c.drafts[at] >= vocab)) {
                throw std::invalid_argument(at_seq("drafts", s, p.rid) + "[" + std::to_string(j) + "] = " +
                                            std::to_string(c.drafts[at]) + " is not a token id");
            }
            if (!c.confidence.empty() && !(c.confidence[at] >= 0.0 && c.confidence[at] <= 1.0)) {
                throw std::invalid_argument(at_seq("confidence", s, p.rid) + "[" + std::to_string(j) +
                                            "] = " + std::to_string(c.confidence[at]) +
                                            " is not a probability in [0, 1]");
            }
        }
    }
}

void Scheduler::store_drafts(Request &r, const StepCommit &c, size_t seq) {
    r.drafts.clear();
    r.confidence.clear();
    if (c.draft_lengths.empty()) {
        return;
    }
    const size_t from = seq * static_cast<size_t>(config_.nextn);
    const size_t len = static_cast<size_t>(c.draft_lengths[seq]);
    r.drafts.assign(c.drafts.begin() + from, c.drafts.begin() + from + len);
    if (!c.confidence.empty()) {
        r.confidence.assign(c.confidence.begin() + from, c.confidence.begin() + from + len);
    }
}

void Scheduler::trim_pages(Request &r) {
    for (size_t i = 0; i < config_.ratios.size(); ++i) {
        const size_t keep =
            static_cast<size_t>(pages_needed(r.num_computed, config_.ratios[i], config_.page_size));
        while (r.pages[i].size() > keep) {
            cache_.release(i, r.pages[i].back());
            r.pages[i].pop_back();
        }
    }
}

std::vector<int32_t> Scheduler::drafts_of(int64_t rid) const {
    const Request *r = find(rid);
    if (r == nullptr) {
        throw std::invalid_argument("Scheduler.drafts_of: rid = " + std::to_string(rid) +
                                    " is not an unfinished request");
    }
    return r->drafts;
}

}  // namespace dsgraph
