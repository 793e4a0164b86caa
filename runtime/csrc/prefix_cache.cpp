#include "prefix_cache.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "page_hash.h"

namespace dsgraph {
namespace {

void check_layout(int32_t page_size, const std::vector<int32_t> &ratios,
                  const std::vector<int32_t> &num_pages) {
    const std::string who = "PrefixCache: ";
    if (page_size <= 0) {
        throw std::invalid_argument(who + "page_size = " + std::to_string(page_size) + " is not positive");
    }
    if (ratios.empty()) {
        throw std::invalid_argument(who + "ratios is empty; expected at least one compression ratio");
    }
    if (num_pages.size() != ratios.size()) {
        throw std::invalid_argument(who + "num_pages has " + std::to_string(num_pages.size()) +
                                    " entries; expected one per ratio (" + std::to_string(ratios.size()) +
                                    ")");
    }
    for (size_t i = 0; i < ratios.size(); ++i) {
        if (ratios[i] <= 0 || (i > 0 && ratios[i] <= ratios[i - 1])) {
            throw std::invalid_argument(who + "ratios[" + std::to_string(i) +
                                        "] = " + std::to_string(ratios[i]) +
                                        "; expected positive, strictly increasing ratios");
        }
    }
}

}  // namespace

PrefixCache::PrefixCache(int32_t page_size, std::vector<int32_t> ratios, std::vector<int32_t> num_pages)
    : page_size_(page_size) {
    check_layout(page_size, ratios, num_pages);
    for (size_t i = 0; i < ratios.size(); ++i) {
        const size_t n = static_cast<size_t>(std::max(num_pages[i], 0));
        tables_.push_back(Table{ratios[i],
                                PagePool(num_pages[i]),
                                {},
                                std::vector<uint64_t>(n, 0),
                                std::vector<uint8_t>(n, 0),
                                {},
                                std::vector<std::list<int32_t>::iterator>(n),
                                std::vector<uint8_t>(n, 0)});
        grain_ = std::lcm(grain_, tokens_per_page(i));
    }
}

int64_t PrefixCache::tokens_per_page(size_t i) const {
    return static_cast<int64_t>(page_size_) * table(i, "PrefixCache.tokens_per_page").ratio;
}

PrefixCache::Table &PrefixCache::table(size_t i, const char *where) {
    return const_cast<Table &>(std::as_const(*this).table(i, where));
}

const PrefixCache::Table &PrefixCache::table(size_t i, const char *where) const {
    if (i >= tables_.size()) {
        throw std::invalid_argument(std::string(where) + ": ratio index " + std::to_string(i) +
                                    " is outside 0.." + std::to_string(tables_.size() - 1));
    }
    return tables_[i];
}

void PrefixCache::evict_one(Table &t) {
    const int32_t page = t.idle.front();
    const size_t p = static_cast<size_t>(page);
    t.idle.pop_front();
    t.is_idle[p] = 0;
    t.page_of.erase(t.key_of[p]);
    t.cached[p] = 0;
    t.pool.release(page);  // the cache's own reference was the last one
    ++t.evicted;
}

std::optional<int32_t> PrefixCache::allocate(size_t i) {
    Table &t = table(i, "PrefixCache.allocate");
    if (t.pool.num_free() == 0 && !t.idle.empty()) {
        evict_one(t);
    }
    return t.pool.allocate();
}

int32_t PrefixCache::num_available(size_t i) const {
    const Table &t = table(i, "PrefixCache.num_available");
    return t.pool.num_free() + static_cast<int32_t>(t.idle.size());
}

void PrefixCache::leave_idle(Table &t, int32_t page) {
    const size_t p = static_cast<size_t>(page);
    if (t.is_idle[p]) {
        t.idle.erase(t.idle_at[p]);
        t.is_idle[p] = 0;
    }
}

void PrefixCache::release(size_t i, int32_t page) {
    Table &t = table(i, "PrefixCache.release");
    if (t.pool.release(page)) {
        return;
    }
    const size_t p = static_cast<size_t>(page);
    if (t.cached[p] && t.pool.refcount(page) == 1) {
        t.idle_at[p] = t.idle.insert(t.idle.end(), page);
        t.is_idle[p] = 1;
    }
}

Chains PrefixCache::chains(std::span<const int32_t> tokens) const {
    Chains out;
    for (size_t i = 0; i < tables_.size(); ++i) {
        out.push_back(hash_chain(tokens, tokens_per_page(i)));
    }
    return out;
}

int64_t PrefixCache::match(const Chains &chains) const {
    if (chains.size() != tables_.size()) {
        throw std::invalid_argument("PrefixCache.match: chains has " + std::to_string(chains.size()) +
                                    " ratios; expected " + std::to_string(tables_.size()));
    }
    int64_t hit = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < tables_.size(); ++i) {
        size_t n = 0;
        while (n < chains[i].size() && tables_[i].page_of.contains(chains[i][n])) {
            ++n;
        }
        hit = std::min(hit, static_cast<int64_t>(n) * tokens_per_page(i));
    }
    return hit - hit % grain_;
}

std::vector<std::vector<int32_t>> PrefixCache::acquire(const Chains &chains, int64_t hit) {
    if (hit < 0 || hit % grain_ != 0 || hit > match(chains)) {
        throw std::invalid_argument("PrefixCache.acquire: hit = " + std::to_string(hit) +
                                    " is not a cached prefix; expected a multiple of " +
                                    std::to_string(grain_) +
                                    " up to match() = " + std::to_string(match(chains)));
    }
    std::vector<std::vector<int32_t>> pages(tables_.size());
    for (size_t i = 0; i < tables_.size(); ++i) {
        Table &t = tables_[i];
        const int64_t count = hit / tokens_per_page(i);
        for (int64_t n = 0; n < count; ++n) {
            const int32_t page = t.page_of.at(chains[i][static_cast<size_t>(n)]);
            leave_idle(t, page);
            t.pool.retain(page);
            pages[i].push_back(page);
        }
    }
    return pages;
}

void PrefixCache::count_lookup(int64_t lookup, int64_t hit) {
    lookup_tokens_ += lookup;
    hit_tokens_ += hit;
}

bool PrefixCache::insert(size_t i, uint64_t key, int32_t page) {
    Table &t = table(i, "PrefixCache.insert");
    if (t.pool.refcount(page) == 0) {
        throw std::invalid_argument("PrefixCache.insert: page " + std::to_string(page) + " of ratio " +
                                    std::to_string(t.ratio) + " is free; expected a page in use");
    }
    const size_t p = static_cast<size_t>(page);
    if (t.cached[p] || t.page_of.contains(key)) {
        return false;
    }
    t.page_of.emplace(key, page);
    t.key_of[p] = key;
    t.cached[p] = 1;
    t.pool.retain(page);
    return true;
}

std::optional<int32_t> PrefixCache::find(size_t i, uint64_t key) const {
    const Table &t = table(i, "PrefixCache.find");
    const auto it = t.page_of.find(key);
    return it == t.page_of.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

std::optional<int32_t> PrefixCache::hold(size_t i, uint64_t key) {
    Table &t = table(i, "PrefixCache.hold");
    const auto it = t.page_of.find(key);
    if (it == t.page_of.end()) {
        return std::nullopt;
    }
    leave_idle(t, it->second);
    t.pool.retain(it->second);
    return it->second;
}

std::optional<int32_t> PrefixCache::adopt(size_t i, uint64_t key) {
    if (table(i, "PrefixCache.adopt").page_of.contains(key)) {
        throw std::invalid_argument("PrefixCache.adopt: the key is cached already; expected a missing page");
    }
    const std::optional<int32_t> page = allocate(i);
    if (page) {
        insert(i, key, *page);
    }
    return page;
}

bool PrefixCache::is_cached(size_t i, int32_t page) const {
    const Table &t = table(i, "PrefixCache.is_cached");
    t.pool.refcount(page);  // range check with the pool's message
    return t.cached[static_cast<size_t>(page)] != 0;
}

std::vector<int32_t> PrefixCache::cached_pages(size_t i) const {
    const Table &t = table(i, "PrefixCache.cached_pages");
    std::vector<int32_t> out;
    for (const auto &[key, page] : t.page_of) {
        out.push_back(page);
    }
    std::sort(out.begin(), out.end());
    return out;
}

int32_t PrefixCache::num_cached(size_t i) const {
    return static_cast<int32_t>(table(i, "PrefixCache.num_cached").page_of.size());
}

int64_t PrefixCache::num_evicted(size_t i) const { return table(i, "PrefixCache.num_evicted").evicted; }

int32_t PrefixCache::num_idle(size_t i) const {
    return static_cast<int32_t>(table(i, "PrefixCache.num_idle").idle.size());
}

}  // namespace dsgraph
