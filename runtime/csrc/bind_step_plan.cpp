// Binding of StepPlan: every array is a read-only numpy view of the plan's own
// memory, alive as long as any view or the plan object is.
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "bindings.h"
#include "step_plan.h"

namespace dsgraph::bind {
namespace {

using namespace nb::literals;
using Self = nb::pointer_and_handle<StepPlan>;

template <typename T>
using View = nb::ndarray<nb::numpy, const T, nb::ndim<1>>;
using View2 = nb::ndarray<nb::numpy, const int32_t, nb::ndim<2>>;

template <typename T>
View<T> view(const std::vector<T> &v, nb::handle owner) {
    return View<T>(v.data(), {v.size()}, owner);
}

View2 view2(const std::vector<int32_t> &v, size_t rows, size_t cols, nb::handle owner) {
    return View2(v.data(), {rows, cols}, owner);
}

View2 block_table(Self self, int32_t ratio) {
    const StepPlan &p = *self.p;
    for (size_t k = 0; k < p.ratios.size(); ++k) {
        if (p.ratios[k] == ratio) {
            return view2(p.block_tables[k], static_cast<size_t>(p.num_seqs()),
                         static_cast<size_t>(p.table_widths[k]), self.h);
        }
    }
    throw std::invalid_argument("StepPlan.block_table: ratio " + std::to_string(ratio) +
                                " has no paged cache in this plan");
}

// A row array property: view of the plan member `field`.
template <auto Field>
auto row_view() {
    return [](Self self) { return view((self.p->*Field), self.h); };
}

}  // namespace

void bind_step_plan(nb::module_ &m) {
    nb::class_<StepPlan>(
        m, "StepPlan",
        "One step's model inputs (flat-batch layout, rows padded to a bucket) and bookkeeping.")
        .def_ro("step", &StepPlan::step, "1 for a scheduler's first plan.")
        .def_ro("bucket", &StepPlan::bucket, "Padded row count; 0 for an empty plan (nothing to run).")
        .def_ro("num_tokens", &StepPlan::num_tokens, "Real rows: the leading rows of every row array.")
        .def_ro("num_decode", &StepPlan::num_decode,
                "Leading sequences that decode (one row, or a verify sequence's 1 + k rows).")
        .def_prop_ro("num_seqs", &StepPlan::num_seqs)
        .def_ro("ratios", &StepPlan::ratios, "Ratios with a block table, ascending.")
        .def_prop_ro("token_ids", row_view<&StepPlan::token_ids>(), "[bucket] int32; padding rows 0.")
        .def_prop_ro("token_src", row_view<&StepPlan::token_src>(),
                     "[bucket] int32: the previous step's sample row whose token this row takes (overlapped "
                     "scheduling; token_ids holds 0 there), else -1.")
        .def_prop_ro("positions", row_view<&StepPlan::positions>(), "[bucket] int32; padding rows 0.")
        .def_prop_ro("seq_ids", row_view<&StepPlan::seq_ids>(), "[bucket] int32; padding rows -1.")
        .def_prop_ro(
            "is_replay", row_view<&StepPlan::is_replay>(),
            "[bucket] int32: 1 where a row recomputes entries a prefix hit holds; its compressed-cache "
            "writes must be skipped.")
        .def_prop_ro("seq_slot", row_view<&StepPlan::seq_slot>(), "[seqs] int32 state slot.")
        .def_prop_ro("seq_start", row_view<&StepPlan::seq_start>(), "[seqs] int32 first position.")
        .def_prop_ro("seq_end", row_view<&StepPlan::seq_end>(), "[seqs] int32 one past the last position.")
        .def_prop_ro("seq_window_start", row_view<&StepPlan::seq_window_start>(),
                     "[seqs] int32 first position whose SWA key the request holds (its replay start "
                     "after a prefix hit, else 0); attention reads no SWA key below it.")
        .def_prop_ro("seq_rids", row_view<&StepPlan::seq_rids>(), "[seqs] int64 request ids.")
        .def_prop_ro("sample_rows", row_view<&StepPlan::sample_rows>(), "[outs] int32 rows to sample.")
        .def_prop_ro("sample_rids", row_view<&StepPlan::sample_rids>(), "[outs] int64 their request ids.")
        .def_prop_ro("verify_start", row_view<&StepPlan::verify_start>(),
                     "[seqs] int32 first sample row (index into sample_rows) of each sequence.")
        .def_prop_ro("verify_len", row_view<&StepPlan::verify_len>(),
                     "[seqs] int32 sample rows of each sequence: 0 (a chunk that samples nothing), 1, or 1 + "
                     "the drafts it verifies.")
        .def_ro("num_verify_drafts", &StepPlan::num_verify_drafts, "Drafts verified in this step.")
        .def_ro("expected_tokens", &StepPlan::expected_tokens,
                "The planner's expected tokens emitted by the decode sequences (0 with drafting off).")
        .def_ro("predicted_ms", &StepPlan::predicted_ms,
                "The curve's predicted step time for the planner's choice (0 without a curve).")
        .def_prop_ro("preempted", row_view<&StepPlan::preempted>(),
                     "int64 ids of requests preempted while planning this step.")
        .def_prop_ro(
            "lookback",
            [](Self self) {
                const StepPlan &p = *self.p;
                return view2(p.lookback, static_cast<size_t>(p.num_seqs()),
                             static_cast<size_t>(p.lookback_len), self.h);
            },
            "[seqs, lookback_len] int32, most recent token first, -1 before position 0.")
        .def_prop_ro(
            "lookback_src",
            [](Self self) {
                const StepPlan &p = *self.p;
                return view2(p.lookback_src, static_cast<size_t>(p.num_seqs()),
                             static_cast<size_t>(p.lookback_len), self.h);
            },
            "[seqs, lookback_len] int32: as token_src, for the lookback entries.")
        .def("block_table", &block_table, "ratio"_a,
             "[seqs, pages_per_seq(ratio)] int32 pages of the ratio's caches, -1 = unallocated.");
}

}  // namespace dsgraph::bind
