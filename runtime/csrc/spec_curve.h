// Throughput curve of the verify/decode step: profiled (rows per step -> step
// time) points, corrected online from measured step times. The verification
// planner (spec_schedule.h) divides expected emitted tokens by this curve's
// prediction, so it must never predict a non-positive time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsgraph {

// How a step of n rows maps onto the profiled points.
enum class CurveLookup {
    // The step runs padded to the first profiled size >= n (a captured bucket),
    // so it costs exactly that bucket's time; DeepInfer's lookup. Sizes between
    // two buckets cost the larger bucket's time: no interpolation, because a
    // padded step does the larger bucket's work.
    kStep,
    // The step runs exactly n rows (eager platforms such as the cpu
    // interpreter): linear interpolation between the two surrounding points,
    // and the first point's time below it.
    kLinear,
};

// Online correction settings (spec deepinfer-parity 5.4, our estimator below).
struct CurveCorrection {
    int32_t window = 5000;      // most recent samples kept (a ring); older ones are forgotten
    int32_t min_samples = 10;   // samples a profiled point needs before its median counts
    double min_fraction = 0.1;  // a corrected time never drops below this fraction of the profile
};

// Estimator: every measured step of n rows gives a per-row residual
// r = (measured - profiled(n)) / size(n), where size(n) is the bucket size
// (kStep) or n (kLinear). The slope is the median over profiled points of the
// median residual of the samples that fell on that point (points with at least
// min_samples samples in the window), 0 while no point qualifies. Medians make
// it robust to outliers (a step stalled by the host, a page-fault burst);
// taking the median across points stops the most frequent bucket from
// dominating. The prediction is profiled(n) + slope * size(n): it models a
// device that runs a fixed amount faster or slower per row than when profiled
// (clock, contention, a longer context than the profiling inputs). Unlike
// DeepInfer, which clamps the slope at 0, a negative slope is kept, bounded so
// that every prediction stays >= min_fraction * profiled(n) > 0.
class ThroughputCurve {
public:
    // sizes: positive, strictly increasing row counts; step_ms: finite and > 0,
    // one per size. Throws std::invalid_argument naming the first bad entry or
    // correction field.
    ThroughputCurve(std::vector<int64_t> sizes, std::vector<double> step_ms,
                    CurveLookup lookup = CurveLookup::kStep, CurveCorrection correction = {});

    const std::vector<int64_t> &sizes() const { return sizes_; }
    const std::vector<double> &step_ms() const { return step_ms_; }
    CurveLookup lookup() const { return lookup_; }
    const CurveCorrection &correction() const { return correction_; }
    int64_t largest() const { return sizes_.back(); }

    // Profiled time of a step of n rows, without correction. Throws
    // std::invalid_argument when n <= 0 or n > largest().
    double profiled(int64_t n) const;
    // Corrected prediction: profiled(n) + slope_ms() * size(n).
    double predict(int64_t n) const;
    // Records the measured time of a step that ran n real rows. Throws
    // std::invalid_argument for a bad n or a measured_ms that is not finite and >= 0.
    void observe(int64_t n, double measured_ms);
    // Forgets every sample (slope back to 0).
    void reset();

    double slope_ms() const { return slope_ms_; }
    // Smallest slope allowed: keeps every prediction >= min_fraction * profiled.
    double min_slope_ms() const { return min_slope_ms_; }
    int64_t num_samples() const { return static_cast<int64_t>(samples_.size()); }

private:
    struct Sample {
        size_t point;     // index of the first profiled size >= n
        double residual;  // per-row residual, ms
    };

    size_t point_of(int64_t n, const char *where) const;
    double size_of(int64_t n, size_t point) const;
    double profiled_at(int64_t n, size_t point) const;
    void refit();

    std::vector<int64_t> sizes_;
    std::vector<double> step_ms_;
    CurveLookup lookup_;
    CurveCorrection correction_;
    std::vector<Sample> samples_;  // ring of at most correction_.window samples
    size_t next_ = 0;              // ring position of the next sample once full
    double slope_ms_ = 0.0;
    double min_slope_ms_ = 0.0;
    std::vector<std::vector<double>> scratch_;  // refit's per-point residuals
};

}  // namespace dsgraph
