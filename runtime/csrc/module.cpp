// Python bindings of dsgraph.runtime._native. Only argument conversion and
// GIL handling live here; the logic is in the per-concept files.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bindings.h"
#include "buckets.h"

#ifndef DSGRAPH_VERSION
#error "DSGRAPH_VERSION must be defined by the build (CMakeLists.txt passes the project version)"
#endif

namespace nb = nanobind;

namespace {

using CountsIn = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BucketsOut = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

BucketsOut choose_many(const dsgraph::BucketTable &table, const CountsIn &counts) {
    const size_t count = counts.shape(0);
    auto out = std::make_unique<int32_t[]>(count);
    {
        // The loop touches only raw buffers; the caller's array stays alive
        // because the argument holds a reference to it.
        nb::gil_scoped_release release;
        table.choose_many(counts.data(), out.get(), count);
    }
    int32_t *data = out.release();
    nb::capsule owner(data, [](void *p) noexcept { delete[] static_cast<int32_t *>(p); });
    return BucketsOut(data, {count}, owner);
}

void bind_buckets(nb::module_ &m) {
    nb::class_<dsgraph::BucketTable>(m, "BucketTable",
                                     "Padded step sizes; a step of n rows runs in the smallest bucket >= n.")
        .def(nb::init<std::vector<int64_t>>(), nb::arg("sizes"),
             "Build from positive, strictly increasing sizes (each at most 2**31 - 1).")
        .def_prop_ro("sizes", &dsgraph::BucketTable::sizes, "The bucket sizes, ascending.")
        .def("choose", &dsgraph::BucketTable::choose, nb::arg("n"),
             "Smallest bucket >= n; ValueError when n <= 0 or n exceeds the largest bucket.")
        .def("choose_many", &choose_many, nb::arg("counts").noconvert(),
             "choose() of every entry of a contiguous int32 CPU array, without the GIL; "
             "ValueError names the first bad entry's index.");
    m.def("pad_rows", &dsgraph::pad_rows, nb::arg("n"), nb::arg("bucket"),
          "Padding rows that fill a bucket holding n real rows; ValueError unless 0 <= n <= bucket.");
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "dsgraph's C++ runtime: bucket table, cache managers, prefix cache and the step scheduler.";
    m.def(
        "version", []() { return DSGRAPH_VERSION; },
        "The dsgraph package version this module was built for.");
    bind_buckets(m);
    dsgraph::bind::bind_caches(m);
    dsgraph::bind::bind_step_plan(m);
    dsgraph::bind::bind_scheduler(m);
    dsgraph::bind::bind_spec(m);
    dsgraph::bind::bind_replay(m);
}
