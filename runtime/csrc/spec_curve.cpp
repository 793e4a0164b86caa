#include "spec_curve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsgraph {
namespace {

void check_points(const std::vector<int64_t> &sizes, const std::vector<double> &step_ms) {
    if (sizes.empty()) {
        throw std::invalid_argument("ThroughputCurve: sizes is empty; expected at least one profiled point");
    }
    if (step_ms.size() != sizes.size()) {
        throw std::invalid_argument("ThroughputCurve: step_ms has " + std::to_string(step_ms.size()) +
                                    " entries; expected one per size (" + std::to_string(sizes.size()) + ")");
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
        const std::string at =
            "ThroughputCurve: sizes[" + std::to_string(i) + "] = " + std::to_string(sizes[i]);
        if (sizes[i] <= 0) {
            throw std::invalid_argument(at + " is not positive; expected row counts > 0");
        }
        if (i > 0 && sizes[i] <= sizes[i - 1]) {
            throw std::invalid_argument(at + " is not greater than sizes[" + std::to_string(i - 1) +
                                        "]; expected strictly increasing sizes");
        }
        if (!std::isfinite(step_ms[i]) || step_ms[i] <= 0.0) {
            throw std::invalid_argument("ThroughputCurve: step_ms[" + std::to_string(i) +
                                        "] = " + std::to_string(step_ms[i]) + " is not finite and > 0");
        }
    }
}

void check_correction(const CurveCorrection &c) {
    if (c.window < 1) {
        throw std::invalid_argument("CurveCorrection.window = " + std::to_string(c.window) +
                                    " is not positive; expected >= 1 samples");
    }
    if (c.min_samples < 1 || c.min_samples > c.window) {
        throw std::invalid_argument("CurveCorrection.min_samples = " + std::to_string(c.min_samples) +
                                    " is outside 1..window = " + std::to_string(c.window));
    }
    if (!(c.min_fraction > 0.0 && c.min_fraction <= 1.0)) {
        throw std::invalid_argument("CurveCorrection.min_fraction = " + std::to_string(c.min_fraction) +
                                    " is outside (0, 1]");
    }
}

// Median of v (reordered in place); v is not empty. Even counts take the mean
// of the two middle values so the result does not depend on sample order.
double median(std::vector<double> &v) {
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
    const double upper = v[mid];
    if (v.size() % 2 == 1) {
        return upper;
    }
    const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
    return 0.5 * (lower + upper);
}

}  // namespace

ThroughputCurve::ThroughputCurve(std::vector<int64_t> sizes, std::vector<double> step_ms, CurveLookup lookup,
                                 CurveCorrection correction)
    : sizes_(std::move(sizes)), step_ms_(std::move(step_ms)), lookup_(lookup), correction_(correction) {
    check_points(sizes_, step_ms_);
    check_correction(correction_);
    // profiled(n) / size(n) is smallest at a profiled point in both lookups (it
    // falls as 1/n on the flat part below the first point and is monotone on
    // each linear segment), so bounding the slope there bounds it everywhere.
    double min_per_row = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < sizes_.size(); ++i) {
        min_per_row = std::min(min_per_row, step_ms_[i] / static_cast<double>(sizes_[i]));
    }
    min_slope_ms_ = -(1.0 - correction_.min_fraction) * min_per_row;
}

size_t ThroughputCurve::point_of(int64_t n, const char *where) const {
    if (n <= 0 || n > largest()) {
        throw std::invalid_argument(std::string(where) + ": n = " + std::to_string(n) +
                                    " rows is outside 1..largest profiled size " + std::to_string(largest()));
    }
    return static_cast<size_t>(std::lower_bound(sizes_.begin(), sizes_.end(), n) - sizes_.begin());
}

double ThroughputCurve::size_of(int64_t n, size_t point) const {
    return static_cast<double>(lookup_ == CurveLookup::kStep ? sizes_[point] : n);
}

double ThroughputCurve::profiled_at(int64_t n, size_t point) const {
    if (lookup_ == CurveLookup::kStep || point == 0 || sizes_[point] == n) {
        return step_ms_[point];
    }
    const double x0 = static_cast<double>(sizes_[point - 1]);
    const double x1 = static_cast<double>(sizes_[point]);
    const double t = (static_cast<double>(n) - x0) / (x1 - x0);
    return step_ms_[point - 1] + t * (step_ms_[point] - step_ms_[point - 1]);
}

double ThroughputCurve::profiled(int64_t n) const {
    return profiled_at(n, point_of(n, "ThroughputCurve.profiled"));
}

double ThroughputCurve::predict(int64_t n) const {
    const size_t point = point_of(n, "ThroughputCurve.predict");
    return profiled_at(n, point) + slope_ms_ * size_of(n, point);
}

void ThroughputCurve::observe(int64_t n, double measured_ms) {
    const size_t point = point_of(n, "ThroughputCurve.observe");
    if (!std::isfinite(measured_ms) || measured_ms < 0.0) {
        throw std::invalid_argument("ThroughputCurve.observe: measured_ms = " + std::to_string(measured_ms) +
                                    " is not finite and >= 0");
    }
    const Sample s{point, (measured_ms - profiled_at(n, point)) / size_of(n, point)};
    if (samples_.size() < static_cast<size_t>(correction_.window)) {
        samples_.push_back(s);
    } else {
        samples_[next_] = s;
        next_ = (next_ + 1) % samples_.size();
    }
    refit();
}

void ThroughputCurve::reset() {
    samples_.clear();
    next_ = 0;
    slope_ms_ = 0.0;
}

void ThroughputCurve::refit() {
    // Reuses the buffers' capacity: refit runs after every step.
    std::vector<std::vector<double>> &by_point = scratch_;
    by_point.resize(sizes_.size());
    for (std::vector<double> &residuals : by_point) {
        residuals.clear();
    }
    for (const Sample &s : samples_) {
        by_point[s.point].push_back(s.residual);
    }
    std::vector<double> medians;
    for (std::vector<double> &residuals : by_point) {
        if (residuals.size() >= static_cast<size_t>(correction_.min_samples)) {
            medians.push_back(median(residuals));
        }
    }
    slope_ms_ = medians.empty() ? 0.0 : std::max(median(medians), min_slope_ms_);
}

}  // namespace dsgraph
