#include "spec_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace dsgraph {
namespace {

double ratio(double num, double den) {
    return den > 0 ? num / den : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

SpecStats::SpecStats(int32_t nextn, int32_t num_bins) : nextn_(nextn), num_bins_(num_bins) {
    if (nextn < 1) {
        throw std::invalid_argument("SpecStats: nextn = " + std::to_string(nextn) + " is not positive");
    }
    if (num_bins < 1) {
        throw std::invalid_argument("SpecStats: num_bins = " + std::to_string(num_bins) + " is not positive");
    }
    reset();
}

void SpecStats::reset() {
    totals_ = SpecStatsSnapshot{};
    totals_.verified_at.assign(static_cast<size_t>(nextn_), 0);
    totals_.reached_at.assign(static_cast<size_t>(nextn_), 0);
    totals_.accepted_at.assign(static_cast<size_t>(nextn_), 0);
    totals_.bin_count.assign(static_cast<size_t>(num_bins_), 0);
    abs_error_sum_ = 0;
    bin_confidence_sum_.assign(static_cast<size_t>(num_bins_), 0.0);
    bin_accepted_.assign(static_cast<size_t>(num_bins_), 0);
}

void SpecStats::check(std::span<const int32_t> verified, std::span<const int32_t> accepted,
                      std::span<const double> conf) const {
    if (accepted.size() != verified.size()) {
        throw std::invalid_argument("SpecStats.record: accepted has " + std::to_string(accepted.size()) +
                                    " entries; expected one per request (" + std::to_string(verified.size()) +
                                    ")");
    }
    if (!conf.empty() && conf.size() != verified.size() * static_cast<size_t>(nextn_)) {
        throw std::invalid_argument("SpecStats.record: confidences hold " + std::to_string(conf.size()) +
                                    " entries; expected requests * nextn = " +
                                    std::to_string(verified.size() * static_cast<size_t>(nextn_)));
    }
    for (size_t i = 0; i < verified.size(); ++i) {
        const std::string at = "SpecStats.record: request " + std::to_string(i) + ": ";
        if (verified[i] < 0 || verified[i] > nextn_) {
            throw std::invalid_argument(at + "verified = " + std::to_string(verified[i]) +
                                        " is outside 0..nextn = " + std::to_string(nextn_));
        }
        if (accepted[i] < 0 || accepted[i] > verified[i]) {
            throw std::invalid_argument(at + "accepted = " + std::to_string(accepted[i]) +
                                        " is outside 0..verified = " + std::to_string(verified[i]));
        }
        for (int32_t j = 0; j < verified[i] && !conf.empty(); ++j) {
            const double q = conf[i * static_cast<size_t>(nextn_) + static_cast<size_t>(j)];
            if (!(q >= 0.0 && q <= 1.0)) {
                throw std::invalid_argument(at + "confidence at position " + std::to_string(j) + " = " +
                                            std::to_string(q) + " is not in [0, 1]");
            }
        }
    }
}

size_t SpecStats::bin_of(double q) const {
    const auto bin = static_cast<int64_t>(q * num_bins_);
    return static_cast<size_t>(std::min<int64_t>(bin, num_bins_ - 1));
}

void SpecStats::record(std::span<const int32_t> verified, std::span<const int32_t> accepted,
                       std::span<const double> conf) {
    check(verified, accepted, conf);
    totals_.steps += 1;
    for (size_t i = 0; i < verified.size(); ++i) {
        const int32_t k = verified[i];
        const int32_t a = accepted[i];
        totals_.sequences += 1;
        totals_.verified_tokens += k;
        totals_.accepted_tokens += a;
        for (int32_t j = 0; j < k; ++j) {
            const auto p = static_cast<size_t>(j);
            totals_.verified_at[p] += 1;
            totals_.reached_at[p] += j <= a ? 1 : 0;
            totals_.accepted_at[p] += j < a ? 1 : 0;
            if (conf.empty() || j > a) {
                continue;
            }
            const double q = conf[i * static_cast<size_t>(nextn_) + p];
            const int outcome = j < a ? 1 : 0;
            const size_t bin = bin_of(q);
            totals_.calibration_count += 1;
            abs_error_sum_ += std::abs(q - outcome);
            totals_.bin_count[bin] += 1;
            bin_confidence_sum_[bin] += q;
            bin_accepted_[bin] += outcome;
        }
    }
}

SpecStatsSnapshot SpecStats::snapshot() const {
    SpecStatsSnapshot s = totals_;
    const auto seqs = static_cast<double>(s.sequences);
    s.accept_rate = ratio(static_cast<double>(s.accepted_tokens), static_cast<double>(s.verified_tokens));
    s.mean_accepted_len = ratio(static_cast<double>(s.accepted_tokens), seqs);
    s.mean_verified_len = ratio(static_cast<double>(s.verified_tokens), seqs);
    for (size_t p = 0; p < static_cast<size_t>(nextn_); ++p) {
        const auto accepted = static_cast<double>(s.accepted_at[p]);
        s.position_accept_rate.push_back(ratio(accepted, static_cast<double>(s.verified_at[p])));
        s.position_conditional_rate.push_back(ratio(accepted, static_cast<double>(s.reached_at[p])));
    }
    const auto pairs = static_cast<double>(s.calibration_count);
    s.calibration_mae = ratio(abs_error_sum_, pairs);
    s.calibration_ece = pairs > 0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
    for (size_t b = 0; b < static_cast<size_t>(num_bins_); ++b) {
        const auto n = static_cast<double>(s.bin_count[b]);
        const double mean_q = ratio(bin_confidence_sum_[b], n);
        const double mean_outcome = ratio(static_cast<double>(bin_accepted_[b]), n);
        s.bin_confidence.push_back(mean_q);
        s.bin_acceptance.push_back(mean_outcome);
        if (n > 0) {
            s.calibration_ece += n / pairs * std::abs(mean_q - mean_outcome);
        }
    }
    return s;
}

}  // namespace dsgraph
