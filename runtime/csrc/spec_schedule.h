// Confidence-scheduled verification (issue 6 item 3; DeepInfer's MTPVarlen,
// spec deepinfer-parity 5.4/5.5): choose how many draft tokens a verify step
// checks in total, and which requests they belong to.
//
// Each of the N decode requests holds up to nextn drafts with the confidence
// head's conditional acceptance probabilities q_i0, q_i1, ...; the probability
// that draft j is accepted is the cumulative product c_ij = q_i0 * ... * q_ij.
// A request verifying k drafts emits 1 + (accepted drafts) tokens, expected
// 1 + c_i0 + ... + c_i(k-1). The planner maximises
//     (N + sum of chosen c_ij) / predict(N + other_rows + T)
// over the total T of verified drafts.
//
// For a fixed T the best choice is the T largest c_ij (ties to the lower
// request, then the lower position): c_ij does not increase along a request
// (every q is in [0, 1]), so the T largest always form a prefix of every
// request's drafts, i.e. a valid allocation, and no allocation of T drafts has
// a larger sum. The step time depends on T only, so scanning T = 0..T_max with
// that greedy prefix finds the optimum over all allocations. A larger T wins
// only when its ratio is strictly larger: of equally good totals the smallest
// is chosen, so a zero-probability draft is never verified.
//
// Requests without confidences (length 0: the first step after prefill, or a
// request whose drafts are not ready) verify no drafts: DeepInfer gives such
// fresh sequences confidence 0 (its placeholder drafts are practically always
// rejected), so they emit their one token and cost one row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "spec_curve.h"

namespace dsgraph {

// Conditional acceptance probabilities of every request's drafts: row-major
// [num_requests, nextn]; request i holds lengths[i] drafts (entries beyond are
// ignored). Every used entry must be finite and in [0, 1].
struct DraftConfidences {
    std::span<const double> conf;
    std::span<const int32_t> lengths;
    int64_t nextn = 0;

    int64_t num_requests() const { return static_cast<int64_t>(lengths.size()); }
};

struct VerifyPlan {
    std::vector<int32_t> drafts;  // per request: drafts to verify (a prefix of its drafts)
    int64_t total_drafts = 0;     // T, the sum of drafts
    int64_t num_rows = 0;         // N + other_rows + T: the rows the step runs
    double expected_tokens = 0;   // N + sum of the chosen cumulative probabilities
    double step_ms = 0;           // curve.predict(num_rows); 0 without a curve or rows
    double draft_ms = 0;          // the draft pass this plan pays for (0 when it verifies nothing)
};

// c_ij as a row-major [num_requests, nextn] vector (0 beyond a request's
// length). Throws std::invalid_argument naming the first bad request/position.
std::vector<double> cumulative_acceptance(const DraftConfidences &d);

// Splits a fixed total of drafts across requests by the greedy prefix (the T
// largest c_ij, ties to the lower request then position). Throws when total is
// negative or exceeds the drafts held.
std::vector<int32_t> split_drafts(const DraftConfidences &d, int64_t total);

// The confidence-scheduled plan: T <= max_total and N + other_rows + T <=
// curve.largest(). other_rows are rows of the same step that are not
// verification (prefill chunks): they cost time and emit nothing counted here.
// fixed_ms is a cost every candidate step pays on top of the curve, the plan
// that verifies nothing included. draft_ms is the draft pass that drafting
// costs per step, by draft depth: draft_ms[D - 1] for a pass drafting D tokens
// per request (an entry past the end repeats the last one; empty: drafting is
// free). Only a plan verifying drafts pays it, since a steady state that
// verifies nothing needs no draft pass either: so the plan verifies no drafts
// whenever N / (predict(N + other_rows) + fixed_ms) beats every drafting plan,
// and a drafting plan of depth D verifies at most D drafts per request. The
// ratio is expected / (predict + fixed_ms + plan.draft_ms); plan.step_ms stays
// the curve's prediction alone. Throws when max_total or other_rows is
// negative, a cost is not finite and >= 0, or the N + other_rows mandatory
// rows do not fit the curve.
VerifyPlan plan_verification(const DraftConfidences &d, const ThroughputCurve &curve, int64_t max_total,
                             int64_t other_rows = 0, double fixed_ms = 0.0,
                             std::span<const double> draft_ms = {});

// Fixed-length mode: request i verifies min(draft_len, lengths[i]) drafts.
// When that exceeds max_total (or the curve), drafts are dropped from the back
// position by position (the last position of every request first, higher
// requests first within a position), so every request keeps its earliest
// drafts; confidences are read only for expected_tokens (pass an empty conf to
// skip them: expected_tokens is then N). curve may be null (step_ms = 0).
VerifyPlan plan_fixed(const DraftConfidences &d, int32_t draft_len, const ThroughputCurve *curve,
                      int64_t max_total, int64_t other_rows = 0);

}  // namespace dsgraph
