#include "buckets.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsgraph {
namespace {

constexpr int64_t kMaxBucket = std::numeric_limits<int32_t>::max();

void check_sizes(const std::vector<int64_t> &sizes) {
    if (sizes.empty()) {
        throw std::invalid_argument(
            "BucketTable: sizes is empty; expected at least one positive bucket size");
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
        const std::string where =
            "BucketTable: sizes[" + std::to_string(i) + "] = " + std::to_string(sizes[i]);
        if (sizes[i] <= 0) {
            throw std::invalid_argument(where + " is not positive; expected every bucket size > 0");
        }
        if (sizes[i] > kMaxBucket) {
            throw std::invalid_argument(
                where + " exceeds the int32 range; expected <= " + std::to_string(kMaxBucket));
        }
        if (i > 0 && sizes[i] <= sizes[i - 1]) {
            throw std::invalid_argument(where + " is not greater than sizes[" + std::to_string(i - 1) +
                                        "] = " + std::to_string(sizes[i - 1]) +
                                        "; expected strictly increasing sizes");
        }
    }
}

// Returns the index of the chosen bucket, or -1 when n is out of range; kept
// exception-free so choose() and choose_many() can word their own errors.
int64_t find_bucket(const std::vector<int64_t> &sizes, int64_t n) {
    if (n <= 0) {
        return -1;
    }
    const auto it = std::lower_bound(sizes.begin(), sizes.end(), n);
    return it == sizes.end() ? -1 : static_cast<int64_t>(it - sizes.begin());
}

std::string no_bucket_message(int64_t n, int64_t largest) {
    if (n <= 0) {
        return "n = " + std::to_string(n) + " is not positive; expected 1 <= n <= largest bucket " +
               std::to_string(largest);
    }
    return "no bucket fits n = " + std::to_string(n) + "; the largest bucket is " + std::to_string(largest);
}

}  // namespace

BucketTable::BucketTable(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) { check_sizes(sizes_); }

int64_t BucketTable::choose(int64_t n) const {
    const int64_t index = find_bucket(sizes_, n);
    if (index < 0) {
        throw std::invalid_argument("BucketTable.choose: " + no_bucket_message(n, largest()));
    }
    return sizes_[static_cast<size_t>(index)];
}

void BucketTable::choose_many(const int32_t *in, int32_t *out, size_t count) const {
    for (size_t i = 0; i < count; ++i) {
        const int64_t index = find_bucket(sizes_, in[i]);
        if (index < 0) {
            throw std::invalid_argument("BucketTable.choose_many: entry " + std::to_string(i) + ": " +
                                        no_bucket_message(in[i], largest()));
        }
        // check_sizes bounded every size to int32, so the narrowing is exact.
        out[i] = static_cast<int32_t>(sizes_[static_cast<size_t>(index)]);
    }
}

int64_t pad_rows(int64_t n, int64_t bucket) {
    if (bucket <= 0) {
        throw std::invalid_argument("pad_rows: bucket = " + std::to_string(bucket) +
                                    " is not positive; expected > 0");
    }
    if (n < 0 || n > bucket) {
        throw std::invalid_argument("pad_rows: n = " + std::to_string(n) +
                                    " is outside 0..bucket = " + std::to_string(bucket));
    }
    return bucket - n;
}

}  // namespace dsgraph
