// Binding entry points of the per-concept binding files, called by module.cpp,
// and the array types they share.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace dsgraph::bind {

namespace nb = nanobind;

// Token ids from Python: a contiguous int32 CPU vector, never a converted copy.
using TokensIn = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

inline std::span<const int32_t> span_of(const TokensIn &a) { return {a.data(), a.shape(0)}; }

// A fresh numpy array that owns a copy of v.
template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(const std::vector<T> &v) {
    T *data = new T[v.size() == 0 ? 1 : v.size()];
    std::copy(v.begin(), v.end(), data);
    nb::capsule owner(data, [](void *p) noexcept { delete[] static_cast<T *>(p); });
    return nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, {v.size()}, owner);
}

void bind_caches(nb::module_ &m);
void bind_replay(nb::module_ &m);
void bind_scheduler(nb::module_ &m);
void bind_spec(nb::module_ &m);
void bind_step_plan(nb::module_ &m);

}  // namespace dsgraph::bind
