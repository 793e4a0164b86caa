// The paged caches of every compression ratio, with a prefix cache on top.
//
// Per ratio r there is one PagePool; a page holds page_size entries, i.e. covers
// page_size * r tokens. A page full of computed prompt tokens can be inserted
// under its chain key (page_hash.h); the cache then holds one reference of its
// own, so a cached page's count is (live users + 1). A cached page whose users
// have all left is "idle": it stays findable and sits in an LRU list until a
// page is needed and none is free, when the least recently released idle page
// is evicted (its key dropped, its last reference released).
//
// A lookup matches the longest prefix cached for every ratio at once, cut to a
// multiple of grain() = lcm over ratios of page_size * r, so the hit ends on a
// page boundary of every ratio's cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "page_pool.h"

namespace dsgraph {

using Chains = std::vector<std::vector<uint64_t>>;  // per ratio: keys of full pages

class PrefixCache {
public:
    // ratios: positive and strictly increasing; num_pages[i] pages for ratios[i].
    // Throws std::invalid_argument naming the bad field.
    PrefixCache(int32_t page_size, std::vector<int32_t> ratios, std::vector<int32_t> num_pages);

    size_t num_ratios() const { return tables_.size(); }
    int32_t ratio(size_t i) const { return tables_.at(i).ratio; }
    int64_t tokens_per_page(size_t i) const;
    int64_t grain() const { return grain_; }
    const PagePool &pool(size_t i) const { return tables_.at(i).pool; }

    // A free page, else an evicted idle cached page, with one reference; nullopt
    // when neither exists.
    std::optional<int32_t> allocate(size_t i);
    // Pages allocate() can still hand out: free plus idle cached.
    int32_t num_available(size_t i) const;
    // Drops one user's reference to a page.
    void release(size_t i, int32_t page);

    // Chain keys of every ratio for `tokens`.
    Chains chains(std::span<const int32_t> tokens) const;
    // Hit length in tokens for these chains (a multiple of grain()); no side effect.
    int64_t match(const Chains &chains) const;
    // Adds a user to the pages holding the first `hit` tokens (hit <= match(),
    // a multiple of grain()) and returns them per ratio.
    std::vector<std::vector<int32_t>> acquire(const Chains &chains, int64_t hit);
    // Counts one lookup of `lookup` prompt tokens that reused `hit` of them.
    void count_lookup(int64_t lookup, int64_t hit);
    // Caches `page` under `key`; false (nothing changes) when the key is already
    // cached or the page already is. Throws for a free page.
    bool insert(size_t i, uint64_t key, int32_t page);
    // The page cached under `key`, or nullopt; no side effect.
    std::optional<int32_t> find(size_t i, uint64_t key) const;
    // Store import: the page cached under `key` with one more user (taken off the idle list), or nullopt
    // when the key is not cached.
    std::optional<int32_t> hold(size_t i, uint64_t key);
    // Store import: a fresh page cached under `key` with one user (the caller), for the caller to fill
    // with the block's bytes; nullopt when no page is free or evictable. The key must not be cached.
    std::optional<int32_t> adopt(size_t i, uint64_t key);

    bool is_cached(size_t i, int32_t page) const;
    std::vector<int32_t> cached_pages(size_t i) const;
    int32_t num_cached(size_t i) const;
    int32_t num_idle(size_t i) const;
    int64_t num_evicted(size_t i) const;
    int64_t lookup_tokens() const { return lookup_tokens_; }
    int64_t hit_tokens() const { return hit_tokens_; }

private:
    struct Table {
        int32_t ratio;
        PagePool pool;
        std::unordered_map<uint64_t, int32_t> page_of;  // key -> page
        std::vector<uint64_t> key_of;                   // page -> key, while cached
        std::vector<uint8_t> cached;
        std::list<int32_t> idle;  // front = released longest ago, evicted first
        std::vector<std::list<int32_t>::iterator> idle_at;
        std::vector<uint8_t> is_idle;
        int64_t evicted = 0;
    };

    Table &table(size_t i, const char *where);
    const Table &table(size_t i, const char *where) const;
    void evict_one(Table &t);
    void leave_idle(Table &t, int32_t page);

    int32_t page_size_;
    int64_t grain_ = 1;
    std::vector<Table> tables_;
    int64_t lookup_tokens_ = 0;
    int64_t hit_tokens_ = 0;
};

}  // namespace dsgraph
