// Bucket table: the fixed set of padded step sizes (tokens or sequences) that
// the runtime captures one program for. Choosing a bucket is on the hot path of
// every step, so it lives here in C++ and has a batched form that runs without
// the GIL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsgraph {

class BucketTable {
public:
    // sizes must be positive, strictly increasing and fit in int32 (bucket
    // sizes cross to Python and to device metadata as int32 arrays).
    // Throws std::invalid_argument naming the first bad entry.
    explicit BucketTable(std::vector<int64_t> sizes);

    const std::vector<int64_t> &sizes() const { return sizes_; }
    int64_t largest() const { return sizes_.back(); }

    // Smallest bucket >= n. Throws std::invalid_argument for n <= 0 or when
    // n exceeds the largest bucket.
    int64_t choose(int64_t n) const;

    // out[i] = choose(in[i]) for i < count. Touches no Python object, so the
    // caller may release the GIL around it. On a bad entry it throws with the
    // entry's index; out is then partially written.
    void choose_many(const int32_t *in, int32_t *out, size_t count) const;

private:
    std::vector<int64_t> sizes_;
};

// Number of padding rows needed to fill a bucket with n real rows.
// Throws std::invalid_argument when n < 0, bucket <= 0 or n > bucket.
int64_t pad_rows(int64_t n, int64_t bucket);

}  // namespace dsgraph
