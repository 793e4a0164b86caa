#include "spec_schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dsgraph {
namespace {

void check_shape(const DraftConfidences &d, bool conf_optional, const char *where) {
    const std::string at = std::string(where) + ": ";
    if (d.nextn < 0) {
        throw std::invalid_argument(at + "nextn = " + std::to_string(d.nextn) + " is negative");
    }
    const size_t want = static_cast<size_t>(d.num_requests() * d.nextn);
    if (d.conf.size() != want && !(conf_optional && d.conf.empty())) {
        throw std::invalid_argument(at + "confidences hold " + std::to_string(d.conf.size()) +
                                    " entries; expected num_requests * nextn = " + std::to_string(want));
    }
    for (int64_t i = 0; i < d.num_requests(); ++i) {
        const int32_t len = d.lengths[static_cast<size_t>(i)];
        if (len < 0 || len > d.nextn) {
            throw std::invalid_argument(at + "lengths[" + std::to_string(i) + "] = " + std::to_string(len) +
                                        " is outside 0..nextn = " + std::to_string(d.nextn));
        }
    }
}

int64_t drafts_held(const DraftConfidences &d) {
    return std::accumulate(d.lengths.begin(), d.lengths.end(), int64_t{0});
}

// Flat indices i * nextn + j of every held draft, by descending c_ij; ties to
// the lower flat index (lower request, then lower position), which keeps the
// order a prefix of every request even where c_ij stays equal (q = 1).
std::vector<int64_t> rank_drafts(const DraftConfidences &d, const std::vector<double> &cum) {
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(drafts_held(d)));
    for (int64_t i = 0; i < d.num_requests(); ++i) {
        for (int64_t j = 0; j < d.lengths[static_cast<size_t>(i)]; ++j) {
            order.push_back(i * d.nextn + j);
        }
    }
    std::stable_sort(order.begin(), order.end(), [&cum](int64_t a, int64_t b) {
        return cum[static_cast<size_t>(a)] > cum[static_cast<size_t>(b)];
    });
    return order;
}

// Rows the curve and max_total leave for drafts; throws when the mandatory rows do not fit.
int64_t draft_room(int64_t num_requests, int64_t other_rows, int64_t max_total, const ThroughputCurve *curve,
                   const char *where) {
    const std::string at = std::string(where) + ": ";
    if (max_total < 0) {
        throw std::invalid_argument(at + "max_total = " + std::to_string(max_total) + " is negative");
    }
    if (other_rows < 0) {
        throw std::invalid_argument(at + "other_rows = " + std::to_string(other_rows) + " is negative");
    }
    if (curve == nullptr) {
        return max_total;
    }
    const int64_t fixed_rows = num_requests + other_rows;
    if (fixed_rows > curve->largest()) {
        throw std::invalid_argument(at + std::to_string(num_requests) + " requests + " +
                                    std::to_string(other_rows) +
                                    " other rows exceed the curve's largest size " +
                                    std::to_string(curve->largest()));
    }
    return std::min(max_total, curve->largest() - fixed_rows);
}

VerifyPlan finish(const DraftConfidences &d, std::vector<int32_t> drafts, const std::vector<double> &cum,
                  const ThroughputCurve *curve, int64_t other_rows) {
    VerifyPlan plan;
    plan.expected_tokens = static_cast<double>(d.num_requests());
    for (int64_t i = 0; i < d.num_requests(); ++i) {
        const int32_t k = drafts[static_cast<size_t>(i)];
        plan.total_drafts += k;
        for (int64_t j = 0; j < k && !cum.empty(); ++j) {
            plan.expected_tokens += cum[static_cast<size_t>(i * d.nextn + j)];
        }
    }
    plan.drafts = std::move(drafts);
    plan.num_rows = d.num_requests() + other_rows + plan.total_drafts;
    plan.step_ms = (curve != nullptr && plan.num_rows > 0) ? curve->predict(plan.num_rows) : 0.0;
    return plan;
}

}  // namespace

std::vector<double> cumulative_acceptance(const DraftConfidences &d) {
    check_shape(d, false, "cumulative_acceptance");
    std::vector<double> cum(d.conf.size(), 0.0);
    for (int64_t i = 0; i < d.num_requests(); ++i) {
        double product = 1.0;
        for (int64_t j = 0; j < d.lengths[static_cast<size_t>(i)]; ++j) {
            const size_t at = static_cast<size_t>(i * d.nextn + j);
            const double q = d.conf[at];
            if (!(q >= 0.0 && q <= 1.0)) {  // also rejects NaN
                throw std::invalid_argument("confidences[" + std::to_string(i) + ", " + std::to_string(j) +
                                            "] = " + std::to_string(q) +
                                            " is not a probability; expected a finite value in [0, 1]");
            }
            product *= q;
            cum[at] = product;
        }
    }
    return cum;
}

std::vector<int32_t> split_drafts(const DraftConfidences &d, int64_t total) {
    const std::vector<double> cum = cumulative_acceptance(d);
    const int64_t held = drafts_held(d);
    if (total < 0 || total > held) {
        throw std::invalid_argument("split_drafts: total = " + std::to_string(total) +
                                    " is outside 0..drafts held " + std::to_string(held));
    }
    const std::vector<int64_t> order = rank_drafts(d, cum);
    std::vector<int32_t> drafts(static_cast<size_t>(d.num_requests()), 0);
    for (int64_t r = 0; r < total; ++r) {
        drafts[static_cast<size_t>(order[static_cast<size_t>(r)] / d.nextn)] += 1;
    }
    return drafts;
}

static void check_cost(double ms, const std::string &what) {
    if (!(std::isfinite(ms) && ms >= 0.0)) {
        throw std::invalid_argument("plan_verification: " + what + " = " + std::to_string(ms) +
                                    "; expected a finite cost in ms >= 0");
    }
}

// The draft pass of depth D (1-based); the last entry covers deeper passes, none costs nothing.
static double depth_cost(std::span<const double> draft_ms, int64_t depth) {
    if (draft_ms.empty()) {
        return 0.0;
    }
    return draft_ms[static_cast<size_t>(std::min<int64_t>(depth, static_cast<int64_t>(draft_ms.size())) - 1)];
}

VerifyPlan plan_verification(const DraftConfidences &d, const ThroughputCurve &curve, int64_t max_total,
                             int64_t other_rows, double fixed_ms, std::span<const double> draft_ms) {
    check_cost(fixed_ms, "fixed_ms");
    for (size_t k = 0; k < draft_ms.size(); ++k) {
        check_cost(draft_ms[k], "draft_ms[" + std::to_string(k) + "]");
    }
    const std::vector<double> cum = cumulative_acceptance(d);
    const int64_t room = draft_room(d.num_requests(), other_rows, max_total, &curve, "plan_verification");
    const std::vector<int64_t> order = rank_drafts(d, cum);
    const int64_t base_rows = d.num_requests() + other_rows;
    std::vector<int32_t> drafts(static_cast<size_t>(d.num_requests()), 0);
    if (d.num_requests() == 0) {
        return finish(d, std::move(drafts), cum, &curve, other_rows);
    }
    const double base = static_cast<double>(d.num_requests());
    double best_ratio = base / (curve.predict(base_rows) + fixed_ms);
    int64_t best_total = 0, best_depth = 0;
    // For each depth D, the greedy prefix over positions j < D is optimal for every total (the step
    // time depends on T and D only); a depth whose pass costs the same as the next one is dominated.
    for (int64_t depth = 1; depth <= d.nextn; ++depth) {
        const double pass = depth_cost(draft_ms, depth);
        if (depth < d.nextn && pass == depth_cost(draft_ms, depth + 1)) {
            continue;
        }
        double expected = base;
        int64_t t = 0;
        for (const int64_t at : order) {
            if (t >= room) {
                break;
            }
            if (at % d.nextn >= depth) {
                continue;
            }
            t += 1;
            expected += cum[static_cast<size_t>(at)];
            const double ratio = expected / (curve.predict(base_rows + t) + fixed_ms + pass);
            if (ratio > best_ratio) {
                best_ratio = ratio;
                best_total = t;
                best_depth = depth;
            }
        }
    }
    int64_t taken = 0;
    for (const int64_t at : order) {
        if (taken == best_total) {
            break;
        }
        if (at % d.nextn < best_depth) {
            drafts[static_cast<size_t>(at / d.nextn)] += 1;
            taken += 1;
        }
    }
    VerifyPlan plan = finish(d, std::move(drafts), cum, &curve, other_rows);
    plan.draft_ms = best_total > 0 ? depth_cost(draft_ms, best_depth) : 0.0;
    return plan;
}

VerifyPlan plan_fixed(const DraftConfidences &d, int32_t draft_len, const ThroughputCurve *curve,
                      int64_t max_total, int64_t other_rows) {
    check_shape(d, true, "plan_fixed");
    if (draft_len < 0) {
        throw std::invalid_argument("plan_fixed: draft_len = " + std::to_string(draft_len) + " is negative");
    }
    const std::vector<double> cum = d.conf.empty() ? std::vector<double>() : cumulative_acceptance(d);
    int64_t room = draft_room(d.num_requests(), other_rows, max_total, curve, "plan_fixed");
    std::vector<int32_t> drafts(static_cast<size_t>(d.num_requests()), 0);
    // Position-major fill keeps every request's earliest drafts when room runs out.
    for (int32_t j = 0; j < draft_len && room > 0; ++j) {
        for (int64_t i = 0; i < d.num_requests() && room > 0; ++i) {
            if (j < d.lengths[static_cast<size_t>(i)]) {
                drafts[static_cast<size_t>(i)] += 1;
                room -= 1;
            }
        }
    }
    return finish(d, std::move(drafts), cum, curve, other_rows);
}

}  // namespace dsgraph
