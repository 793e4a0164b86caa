// Acceptance statistics of speculative verification (issue 6 item 4; the
// fields DeepInfer logs, spec deepinfer-parity 5.7, plus calibration of the
// confidence head).
//
// Per verify step and request: drafts verified k, drafts accepted a <= k (a
// prefix), and optionally the conditional confidences q_0..q_{k-1} the
// planner used. Draft j is *verified* when j < k, *reached* when j <= a (every
// earlier draft was accepted: only then is its own acceptance decided by the
// target) and *accepted* when j < a.
//
// Calibration pairs each reached draft's conditional confidence q_j with its
// realised acceptance (1 when j < a, else 0): q_j predicts exactly that event.
// The mean absolute error is mean |q_j - outcome_j|; the expected calibration
// error splits the pairs into num_bins equal-width confidence bins on [0, 1]
// (q = 1 in the last) and is sum over bins of (n_b / n) |mean q - mean outcome|.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dsgraph {

struct SpecStatsSnapshot {
    int64_t steps = 0;            // record() calls
    int64_t sequences = 0;        // request-steps recorded (each emits accepted + 1 tokens)
    int64_t verified_tokens = 0;  // drafts verified
    int64_t accepted_tokens = 0;  // drafts accepted
    // Rates are NaN where their denominator is 0.
    double accept_rate = 0;          // accepted / verified (DeepInfer's avg_nextn_accept_rate)
    double mean_accepted_len = 0;    // accepted / sequences
    double mean_verified_len = 0;    // verified / sequences (DeepInfer's avg_verified_len)
    std::vector<int64_t> verified_at;  // per position: requests that verified it
    // per position: requests that verified it and accepted every earlier draft
    std::vector<int64_t> reached_at;
    std::vector<int64_t> accepted_at;  // per position: requests that accepted it
    // accepted_at / verified_at (DeepInfer's nextn_accept_rate)
    std::vector<double> position_accept_rate;
    std::vector<double> position_conditional_rate;  // accepted_at / reached_at
    int64_t calibration_count = 0;                  // (confidence, outcome) pairs
    double calibration_mae = 0;                     // mean |q - outcome|
    double calibration_ece = 0;                     // binned expected calibration error
    std::vector<int64_t> bin_count;                 // pairs per bin
    std::vector<double> bin_confidence;             // mean q per bin
    std::vector<double> bin_acceptance;             // mean outcome per bin
};

class SpecStats {
public:
    // Throws std::invalid_argument unless nextn >= 1 and num_bins >= 1.
    explicit SpecStats(int32_t nextn, int32_t num_bins = 10);

    // verified[i], accepted[i]: request i's counts this step, 0 <= accepted <=
    // verified <= nextn. conf: row-major [requests, nextn] conditional
    // confidences, or empty (no calibration pairs this step). Validates every
    // entry before changing any total; throws naming the first bad one.
    void record(std::span<const int32_t> verified, std::span<const int32_t> accepted,
                std::span<const double> conf);
    SpecStatsSnapshot snapshot() const;
    void reset();

    int32_t nextn() const { return nextn_; }
    int32_t num_bins() const { return num_bins_; }

private:
    void check(std::span<const int32_t> verified, std::span<const int32_t> accepted,
               std::span<const double> conf) const;
    size_t bin_of(double q) const;

    int32_t nextn_;
    int32_t num_bins_;
    SpecStatsSnapshot totals_;   // counters only; snapshot() derives the rates
    double abs_error_sum_ = 0;
    std::vector<double> bin_confidence_sum_;
    std::vector<int64_t> bin_accepted_;
};

}  // namespace dsgraph
