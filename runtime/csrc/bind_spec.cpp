// Bindings of confidence-scheduled verification: ThroughputCurve, the planner
// functions and SpecStats. Confidences cross as a contiguous float64
// [requests, nextn] array with an int32 [requests] array of draft counts.
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "spec_curve.h"
#include "spec_schedule.h"
#include "spec_stats.h"

namespace dsgraph::bind {
namespace {

using namespace nb::literals;
using ConfIn = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CountsIn = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

std::span<const int32_t> counts(const CountsIn &a) { return {a.data(), a.shape(0)}; }

// conf may be an invalid (None) array: lengths alone, nextn = the largest length.
DraftConfidences drafts_of(const ConfIn &conf, const CountsIn &lengths, const char *where) {
    DraftConfidences d;
    d.lengths = counts(lengths);
    if (!conf.is_valid()) {
        // Never negative, so a negative length is the entry the error names.
        d.nextn = d.lengths.empty() ? 0 : std::max(0, *std::max_element(d.lengths.begin(), d.lengths.end()));
        return d;
    }
    if (conf.shape(0) != lengths.shape(0)) {
        throw std::invalid_argument(std::string(where) + ": confidences have " +
                                    std::to_string(conf.shape(0)) + " rows but lengths has " +
                                    std::to_string(lengths.shape(0)) +
                                    " entries; expected one row per request");
    }
    d.nextn = static_cast<int64_t>(conf.shape(1));
    d.conf = {conf.data(), conf.shape(0) * conf.shape(1)};
    return d;
}

void init_curve(ThroughputCurve *self, std::vector<int64_t> sizes, std::vector<double> step_ms,
                CurveLookup lookup, int32_t window, int32_t min_samples, double min_fraction) {
    new (self) ThroughputCurve(std::move(sizes), std::move(step_ms), lookup,
                               CurveCorrection{window, min_samples, min_fraction});
}

void bind_curve(nb::module_ &m) {
    nb::enum_<CurveLookup>(m, "CurveLookup",
                           "STEP: a step of n rows costs the first profiled size >= n (padded buckets); "
                           "LINEAR: linear interpolation between profiled sizes (eager platforms).")
        .value("STEP", CurveLookup::kStep)
        .value("LINEAR", CurveLookup::kLinear);
    nb::class_<ThroughputCurve>(m, "ThroughputCurve",
                                "Profiled (rows per step -> step ms) points with an online per-row slope "
                                "correction; runtime/csrc/spec_curve.h documents the estimator.")
        .def("__init__", &init_curve, "sizes"_a, "step_ms"_a, "lookup"_a = CurveLookup::kStep,
             "window"_a = 5000, "min_samples"_a = 10, "min_fraction"_a = 0.1,
             "ValueError names the first bad size, time or correction setting.")
        .def_prop_ro("sizes", &ThroughputCurve::sizes, "Profiled row counts, ascending.")
        .def_prop_ro("step_ms", &ThroughputCurve::step_ms, "Profiled step times (ms), one per size.")
        .def_prop_ro("lookup", &ThroughputCurve::lookup)
        .def_prop_ro("largest", &ThroughputCurve::largest)
        .def_prop_ro("window", [](const ThroughputCurve &c) { return c.correction().window; })
        .def_prop_ro("min_samples", [](const ThroughputCurve &c) { return c.correction().min_samples; })
        .def_prop_ro("min_fraction", [](const ThroughputCurve &c) { return c.correction().min_fraction; })
        .def_prop_ro("slope_ms", &ThroughputCurve::slope_ms, "Current per-row correction (ms).")
        .def_prop_ro("min_slope_ms", &ThroughputCurve::min_slope_ms)
        .def_prop_ro("num_samples", &ThroughputCurve::num_samples, "Samples in the window.")
        .def("profiled", &ThroughputCurve::profiled, "n"_a, "Profiled time of n rows, uncorrected.")
        .def("predict", &ThroughputCurve::predict, "n"_a, "Corrected time of n rows (ms), always > 0.")
        .def("observe", &ThroughputCurve::observe, "n"_a, "measured_ms"_a,
             "Record a measured step of n real rows and refit the slope.")
        .def("reset", &ThroughputCurve::reset, "Forget every sample (slope 0).");
}

void bind_planner(nb::module_ &m) {
    nb::class_<VerifyPlan>(m, "VerifyPlan", "Drafts each request verifies this step, and the plan's value.")
        .def_prop_ro(
            "drafts",
            [](nb::pointer_and_handle<VerifyPlan> self) {
                const std::vector<int32_t> &v = self.p->drafts;
                return nb::ndarray<nb::numpy, const int32_t, nb::ndim<1>>(v.data(), {v.size()}, self.h);
            },
            "[requests] int32, a read-only view alive as long as the plan.")
        .def_ro("total_drafts", &VerifyPlan::total_drafts)
        .def_ro("num_rows", &VerifyPlan::num_rows, "requests + other_rows + total_drafts.")
        .def_ro("expected_tokens", &VerifyPlan::expected_tokens)
        .def_ro("step_ms", &VerifyPlan::step_ms, "Predicted step time; 0 without a curve.")
        .def_ro("draft_ms", &VerifyPlan::draft_ms, "The draft pass the plan pays for (0: it drafts nothing).");
    m.def(
        "cumulative_acceptance",
        [](const ConfIn &conf, const CountsIn &lengths) {
            const DraftConfidences d = drafts_of(conf, lengths, "cumulative_acceptance");
            const std::vector<double> cum = cumulative_acceptance(d);
            auto *data = new double[cum.empty() ? 1 : cum.size()];
            std::copy(cum.begin(), cum.end(), data);
            nb::capsule owner(data, [](void *p) noexcept { delete[] static_cast<double *>(p); });
            return nb::ndarray<nb::numpy, double, nb::ndim<2>>(data, {conf.shape(0), conf.shape(1)}, owner);
        },
        "conf"_a.noconvert(), "lengths"_a.noconvert(),
        "[requests, nextn] float64 cumulative products (0 past a request's length).");
    m.def(
        "split_drafts",
        [](const ConfIn &conf, const CountsIn &lengths, int64_t total) {
            return to_numpy(split_drafts(drafts_of(conf, lengths, "split_drafts"), total));
        },
        "conf"_a.noconvert(), "lengths"_a.noconvert(), "total"_a,
        "Drafts per request when `total` drafts go to the largest cumulative probabilities.");
    m.def(
        "plan_verification",
        [](const ConfIn &conf, const CountsIn &lengths, const ThroughputCurve &curve, int64_t max_total,
           int64_t other_rows, double fixed_ms, const std::vector<double> &draft_ms) {
            const DraftConfidences d = drafts_of(conf, lengths, "plan_verification");
            return plan_verification(d, curve, max_total, other_rows, fixed_ms, draft_ms);
        },
        "conf"_a.noconvert(), "lengths"_a.noconvert(), "curve"_a, "max_total"_a, "other_rows"_a = 0,
        "fixed_ms"_a = 0.0, "draft_ms"_a = std::vector<double>(),
        "The drafts maximising expected tokens / (predicted time + fixed_ms + the draft pass by depth, paid "
        "only by a plan that verifies drafts), split by the greedy prefix.");
    m.def(
        "plan_fixed",
        [](const ConfIn &conf, const CountsIn &lengths, int32_t draft_len, const ThroughputCurve *curve,
           int64_t max_total, int64_t other_rows) {
            const DraftConfidences d = drafts_of(conf, lengths, "plan_fixed");
            return plan_fixed(d, draft_len, curve, max_total, other_rows);
        },
        "conf"_a.noconvert().none(), "lengths"_a.noconvert(), "draft_len"_a, "curve"_a.none(), "max_total"_a,
        "other_rows"_a = 0, "Every request verifies min(draft_len, its drafts), trimmed to max_total.");
}

void bind_stats(nb::module_ &m) {
    nb::class_<SpecStatsSnapshot>(
        m, "SpecStatsSnapshot",
        "Totals and rates (NaN where undefined); runtime/csrc/spec_stats.h defines them.")
        .def_ro("steps", &SpecStatsSnapshot::steps)
        .def_ro("sequences", &SpecStatsSnapshot::sequences)
        .def_ro("verified_tokens", &SpecStatsSnapshot::verified_tokens)
        .def_ro("accepted_tokens", &SpecStatsSnapshot::accepted_tokens)
        .def_ro("accept_rate", &SpecStatsSnapshot::accept_rate)
        .def_ro("mean_accepted_len", &SpecStatsSnapshot::mean_accepted_len)
        .def_ro("mean_verified_len", &SpecStatsSnapshot::mean_verified_len)
        .def_ro("verified_at", &SpecStatsSnapshot::verified_at)
        .def_ro("reached_at", &SpecStatsSnapshot::reached_at)
        .def_ro("accepted_at", &SpecStatsSnapshot::accepted_at)
        .def_ro("position_accept_rate", &SpecStatsSnapshot::position_accept_rate)
        .def_ro("position_conditional_rate", &SpecStatsSnapshot::position_conditional_rate)
        .def_ro("calibration_count", &SpecStatsSnapshot::calibration_count)
        .def_ro("calibration_mae", &SpecStatsSnapshot::calibration_mae)
        .def_ro("calibration_ece", &SpecStatsSnapshot::calibration_ece)
        .def_ro("bin_count", &SpecStatsSnapshot::bin_count)
        .def_ro("bin_confidence", &SpecStatsSnapshot::bin_confidence)
        .def_ro("bin_acceptance", &SpecStatsSnapshot::bin_acceptance);
    nb::class_<SpecStats>(m, "SpecStats",
                          "Accumulates verify outcomes: acceptance per position, calibration.")
        .def(nb::init<int32_t, int32_t>(), "nextn"_a, "num_bins"_a = 10)
        .def_prop_ro("nextn", &SpecStats::nextn)
        .def_prop_ro("num_bins", &SpecStats::num_bins)
        .def(
            "record",
            [](SpecStats &s, const CountsIn &verified, const CountsIn &accepted, const ConfIn &conf) {
                std::span<const double> c;
                if (conf.is_valid()) {
                    const auto nextn = static_cast<size_t>(s.nextn());
                    if (conf.shape(0) != verified.shape(0) || conf.shape(1) != nextn) {
                        throw std::invalid_argument("SpecStats.record: confidences have shape [" +
                                                    std::to_string(conf.shape(0)) + ", " +
                                                    std::to_string(conf.shape(1)) + "]; expected [" +
                                                    std::to_string(verified.shape(0)) + ", " +
                                                    std::to_string(s.nextn()) + "]");
                    }
                    c = {conf.data(), conf.shape(0) * conf.shape(1)};
                }
                s.record(counts(verified), counts(accepted), c);
            },
            "verified"_a.noconvert(), "accepted"_a.noconvert(), "conf"_a.noconvert().none() = nb::none(),
            "One verify step: int32 [requests] verified and accepted drafts, optional float64 "
            "[requests, nextn] conditional confidences; ValueError names the bad request.")
        .def("snapshot", &SpecStats::snapshot)
        .def("reset", &SpecStats::reset);
}

}  // namespace

void bind_spec(nb::module_ &m) {
    bind_curve(m);
    bind_planner(m);
    bind_stats(m);
}

}  // namespace dsgraph::bind
