// Bindings of the cache managers: SlotPool, PagePool, PrefixCache, hash_chain.
// Python addresses a PrefixCache's ratios by value (1, 2), not by index.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "bindings.h"
#include "page_hash.h"
#include "page_pool.h"
#include "prefix_cache.h"
#include "slot_pool.h"

namespace dsgraph::bind {
namespace {

using namespace nb::literals;

size_t ratio_index(const PrefixCache &c, int32_t ratio) {
    std::string known;
    for (size_t i = 0; i < c.num_ratios(); ++i) {
        if (c.ratio(i) == ratio) {
            return i;
        }
        known += (i ? ", " : "") + std::to_string(c.ratio(i));
    }
    throw std::invalid_argument("PrefixCache: ratio " + std::to_string(ratio) + " is not one of [" + known +
                                "]");
}

void bind_pools(nb::module_ &m) {
    nb::class_<SlotPool>(m, "SlotPool", "State slots (SWA rings + compressor state), one owner each.")
        .def(nb::init<int32_t>(), "num_slots"_a)
        .def("allocate", &SlotPool::allocate, "A free slot (least recently released first), or None.")
        .def("release", &SlotPool::release, "slot"_a, "Frees a slot; ValueError when it is not in use.")
        .def("is_used", &SlotPool::is_used, "slot"_a)
        .def_prop_ro("num_total", &SlotPool::num_total)
        .def_prop_ro("num_free", &SlotPool::num_free)
        .def_prop_ro("num_used", &SlotPool::num_used);
    nb::class_<PagePool>(m, "PagePool", "Pages of one ratio's paged caches, with reference counts.")
        .def(nb::init<int32_t>(), "num_pages"_a)
        .def("allocate", &PagePool::allocate, "A free page with reference count 1, or None.")
        .def("retain", &PagePool::retain, "page"_a, "Adds a reference; ValueError for a free page.")
        .def("release", &PagePool::release, "page"_a,
             "Drops a reference; True when the count reached 0 and the page is free again.")
        .def("refcount", &PagePool::refcount, "page"_a)
        .def_prop_ro("num_total", &PagePool::num_total)
        .def_prop_ro("num_free", &PagePool::num_free)
        .def_prop_ro("num_used", &PagePool::num_used);
}

void bind_prefix_queries(nb::class_<PrefixCache> &c) {
    c.def(
         "match",
         [](const PrefixCache &p, const TokensIn &prompt) { return p.match(p.chains(span_of(prompt))); },
         "prompt"_a.noconvert(), "Tokens of the longest prefix cached for every ratio (a multiple of grain).")
        .def(
            "acquire",
            [](PrefixCache &p, const TokensIn &prompt, int64_t hit) {
                return p.acquire(p.chains(span_of(prompt)), hit);
            },
            "prompt"_a.noconvert(), "hit"_a,
            "Adds a user to the pages of the first `hit` tokens; returns them per ratio (ascending ratios).")
        .def("count_lookup", &PrefixCache::count_lookup, "lookup"_a, "hit"_a)
        .def(
            "insert",
            [](PrefixCache &p, const TokensIn &prompt, int32_t ratio, int64_t index, int32_t page) {
                const size_t i = ratio_index(p, ratio);
                const std::vector<uint64_t> keys = p.chains(span_of(prompt))[i];
                if (index < 0 || static_cast<size_t>(index) >= keys.size()) {
                    throw std::invalid_argument("PrefixCache.insert: index " + std::to_string(index) +
                                                " is not a full page of the prompt (it has " +
                                                std::to_string(keys.size()) + " for ratio " +
                                                std::to_string(ratio) + ")");
                }
                return p.insert(i, keys[static_cast<size_t>(index)], page);
            },
            "prompt"_a.noconvert(), "ratio"_a, "index"_a, "page"_a,
            "Caches `page` as page `index` of the prompt's chain; False when that prefix or page is cached.")
        .def_prop_ro("grain", &PrefixCache::grain)
        .def_prop_ro("lookup_tokens", &PrefixCache::lookup_tokens)
        .def_prop_ro("hit_tokens", &PrefixCache::hit_tokens);
}

void bind_prefix_cache(nb::module_ &m) {
    nb::class_<PrefixCache> c(m, "PrefixCache",
                              "Per-ratio page pools with hash-chained prompt pages and an LRU of idle ones.");
    c.def(nb::init<int32_t, std::vector<int32_t>, std::vector<int32_t>>(), "page_size"_a, "ratios"_a,
          "num_pages"_a)
        .def(
            "allocate", [](PrefixCache &p, int32_t r) { return p.allocate(ratio_index(p, r)); }, "ratio"_a,
            "A free page, else an evicted idle cached page; None when neither exists.")
        .def(
            "release", [](PrefixCache &p, int32_t r, int32_t page) { p.release(ratio_index(p, r), page); },
            "ratio"_a, "page"_a)
        .def(
            "refcount",
            [](const PrefixCache &p, int32_t r, int32_t page) {
                return p.pool(ratio_index(p, r)).refcount(page);
            },
            "ratio"_a, "page"_a)
        .def(
            "num_free", [](const PrefixCache &p, int32_t r) { return p.pool(ratio_index(p, r)).num_free(); },
            "ratio"_a)
        .def(
            "num_available",
            [](const PrefixCache &p, int32_t r) { return p.num_available(ratio_index(p, r)); }, "ratio"_a)
        .def(
            "num_cached", [](const PrefixCache &p, int32_t r) { return p.num_cached(ratio_index(p, r)); },
            "ratio"_a)
        .def(
            "num_idle", [](const PrefixCache &p, int32_t r) { return p.num_idle(ratio_index(p, r)); },
            "ratio"_a)
        .def(
            "num_evicted", [](const PrefixCache &p, int32_t r) { return p.num_evicted(ratio_index(p, r)); },
            "ratio"_a, "Idle cached pages evicted so far to serve allocations.")
        .def(
            "is_cached",
            [](const PrefixCache &p, int32_t r, int32_t page) {
                return p.is_cached(ratio_index(p, r), page);
            },
            "ratio"_a, "page"_a)
        .def(
            "cached_pages", [](const PrefixCache &p, int32_t r) { return p.cached_pages(ratio_index(p, r)); },
            "ratio"_a);
    bind_prefix_queries(c);
    m.def(
        "hash_chain",
        [](const TokensIn &tokens, int64_t tokens_per_page) {
            return to_numpy(hash_chain(span_of(tokens), tokens_per_page));
        },
        "tokens"_a.noconvert(), "tokens_per_page"_a, "Chain keys of the full pages of `tokens` (uint64).");
}

}  // namespace

void bind_caches(nb::module_ &m) {
    bind_pools(m);
    bind_prefix_cache(m);
}

}  // namespace dsgraph::bind
