// One request's state inside the scheduler: its tokens (prompt then outputs),
// how many of them are in the caches, the slot and pages it holds, and its stop
// conditions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "prefix_cache.h"

namespace dsgraph {

// Overlapped scheduling: a token sampled by a step whose results are not on the host yet is held as
// kUnresolvedBase - row (row: its sample row in that step), so the next plan can be made before it is
// known; resolve() writes the real id. Only a request's newest token can be unresolved.
constexpr int32_t kUnresolvedBase = -2;
inline int32_t unresolved_token(int32_t row) { return kUnresolvedBase - row; }
inline bool is_unresolved(int32_t token) { return token <= kUnresolvedBase; }
inline int32_t unresolved_row(int32_t token) { return kUnresolvedBase - token; }

struct StopParams {
    int32_t max_tokens = 1;
    int32_t eos_id = -1;  // -1: no end-of-sequence token
    bool ignore_eos = false;
    std::vector<int32_t> stop_token_ids;
};

struct Request {
    int64_t rid = 0;
    uint64_t serial = 0;  // unique per add: tells a request from a later one reusing its rid
    std::vector<int32_t> tokens;
    int32_t prompt_len = 0;
    StopParams stop;
    // false: admitted without a prefix-cache lookup and never offering its pages (a request that needs
    // every prompt position computed, e.g. for prompt log-probabilities)
    bool use_prefix_cache = true;
    // Most prompt tokens one step may prefill for this request (0: only the step's token budget). A
    // router sizes it so that the step fits its time budget: attention makes a token late in a long
    // context dearer than an early one.
    int32_t max_chunk = 0;

    int32_t num_computed = 0;  // leading tokens whose cache entries exist
    int32_t replay_end = 0;    // positions below it recompute entries already cached (prefix hit)
    int32_t window_start = 0;  // first position whose SWA key this admission computes (its replay start)
    int32_t slot = -1;         // -1 while not admitted
    uint64_t admitted_at = 0;  // admission order; the preemption victim is the largest
    uint64_t planned_in = 0;   // the step whose plan holds this request (0: none)
    int64_t last_planned = 0;  // the newest step whose plan held it: its caches are in use until that step is done
    bool gone = false;         // forgotten (finished or aborted); alive only until its steps are done
    bool aborted = false;
    std::vector<std::vector<int32_t>> pages;  // per ratio, in sequence order
    Chains chain;                             // per ratio: keys of the prompt's full pages
    std::vector<int32_t> num_settled;         // per ratio: leading pages already offered to the cache
    bool handed_off = false;                  // PROMPT engine: done, caches held for hand-off
    // Speculative decoding: the drafter's guesses for the tokens after the newest one, and the confidence
    // head's conditional acceptance probability of each (empty when not given). Replaced by every commit
    // that emits tokens, cleared when the request gives its caches up (preemption).
    std::vector<int32_t> drafts;
    std::vector<double> confidence;

    bool admitted() const { return slot >= 0; }
    int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
    int32_t num_outputs() const { return num_tokens() - prompt_len; }
    // Admitted and every token but the newest is cached: the next row is a decode row.
    // Token at position p: a committed token, or the (p - num_tokens)-th draft.
    int32_t token_at(int32_t p) const {
        const int32_t n = num_tokens();
        return p < n ? tokens[static_cast<size_t>(p)] : drafts[static_cast<size_t>(p - n)];
    }
    bool decoding() const { return admitted() && num_computed == num_tokens() - 1 && num_outputs() > 0; }
};

}  // namespace dsgraph
