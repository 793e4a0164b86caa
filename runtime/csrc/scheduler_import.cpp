// Store import half of the scheduler: a prompt's prefix pages computed by another engine (read from the
// KV store) become prefix-cache pages here; admission then treats them as any other prefix hit.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler.h"

namespace dsgraph {

std::vector<std::vector<int32_t>> Scheduler::prefix_pages(std::span<const int32_t> prompt) const {
    const Chains chains = cache_.chains(prompt);
    std::vector<std::vector<int32_t>> out(chains.size());
    for (size_t i = 0; i < chains.size(); ++i) {
        for (const uint64_t key : chains[i]) {
            const std::optional<int32_t> page = cache_.find(i, key);
            if (!page) {
                break;
            }
            out[i].push_back(*page);
        }
    }
    return out;
}

std::vector<std::vector<int32_t>> Scheduler::import_prefix(std::span<const int32_t> prompt,
                                                           const std::vector<int32_t> &counts) {
    if (counts.size() != config_.ratios.size()) {
        throw std::invalid_argument("Scheduler.import_prefix: counts has " + std::to_string(counts.size()) +
                                    " entries; expected one per ratio (" +
                                    std::to_string(config_.ratios.size()) + ")");
    }
    const Chains chains = cache_.chains(prompt);
    std::vector<std::vector<int32_t>> out(chains.size());
    std::vector<std::vector<int32_t>> held(chains.size());  // one reference each, dropped at the end
    for (size_t i = 0; i < chains.size(); ++i) {
        const size_t want = std::min(static_cast<size_t>(std::max(counts[i], 0)), chains[i].size());
        for (size_t n = 0; n < want; ++n) {
            if (const std::optional<int32_t> page = cache_.hold(i, chains[i][n])) {
                held[i].push_back(*page);
                out[i].push_back(-1);
                continue;
            }
            const std::optional<int32_t> page = cache_.adopt(i, chains[i][n]);
            if (!page) {
                break;
            }
            held[i].push_back(*page);
            out[i].push_back(*page);
        }
    }
    for (size_t i = 0; i < held.size(); ++i) {
        // last page first: in the idle LRU a chain's tail is evicted before its head
        for (auto it = held[i].rbegin(); it != held[i].rend(); ++it) {
            cache_.release(i, *it);
        }
    }
    return out;
}

}  // namespace dsgraph
