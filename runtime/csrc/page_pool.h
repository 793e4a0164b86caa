// Pages of one compression ratio's paged caches. A page may be shared (by the
// requests that reuse a cached prefix, and by the prefix cache itself), so each
// page carries a reference count: allocate() hands out a page with count 1,
// retain() adds a user, release() drops one, and the page returns to the free
// list when its count reaches 0.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace dsgraph {

class PagePool {
public:
    // Pages 0..num_pages-1, all free. Throws std::invalid_argument unless num_pages > 0.
    explicit PagePool(int32_t num_pages);

    // The free page released longest ago (never-used pages first, in increasing
    // order) with reference count 1; nullopt when no page is free.
    std::optional<int32_t> allocate();
    // Adds a reference to a page in use; throws std::invalid_argument when the
    // page is out of range or free (retaining a free page would resurrect it
    // behind the free list's back).
    void retain(int32_t page);
    // Drops a reference; returns true when the count reached 0 and the page went
    // back to the free list. Throws std::invalid_argument for a free page.
    bool release(int32_t page);

    int32_t refcount(int32_t page) const;
    const std::vector<int32_t> &refcounts() const { return counts_; }
    int32_t num_total() const { return static_cast<int32_t>(counts_.size()); }
    int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
    int32_t num_used() const { return num_total() - num_free(); }

private:
    void check_in_use(int32_t page, const char *where) const;

    std::deque<int32_t> free_;
    std::vector<int32_t> counts_;
};

}  // namespace dsgraph
