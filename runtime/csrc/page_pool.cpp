#include "page_pool.h"

#include <stdexcept>
#include <string>

namespace dsgraph {
namespace {

void check_range(int32_t page, int32_t total, const char *where) {
    if (page < 0 || page >= total) {
        throw std::invalid_argument(std::string(where) + ": page " + std::to_string(page) +
                                    " is outside 0.." + std::to_string(total - 1));
    }
}

}  // namespace

PagePool::PagePool(int32_t num_pages) {
    if (num_pages <= 0) {
        throw std::invalid_argument("PagePool: num_pages = " + std::to_string(num_pages) +
                                    " is not positive; expected at least one page");
    }
    counts_.assign(static_cast<size_t>(num_pages), 0);
    for (int32_t p = 0; p < num_pages; ++p) {
        free_.push_back(p);
    }
}

void PagePool::check_in_use(int32_t page, const char *where) const {
    check_range(page, num_total(), where);
    if (counts_[static_cast<size_t>(page)] == 0) {
        throw std::invalid_argument(std::string(where) + ": page " + std::to_string(page) +
                                    " is free (reference count 0); expected a page in use");
    }
}

std::optional<int32_t> PagePool::allocate() {
    if (free_.empty()) {
        return std::nullopt;
    }
    const int32_t page = free_.front();
    free_.pop_front();
    counts_[static_cast<size_t>(page)] = 1;
    return page;
}

void PagePool::retain(int32_t page) {
    check_in_use(page, "PagePool.retain");
    ++counts_[static_cast<size_t>(page)];
}

bool PagePool::release(int32_t page) {
    check_in_use(page, "PagePool.release");
    if (--counts_[static_cast<size_t>(page)] > 0) {
        return false;
    }
    free_.push_back(page);
    return true;
}

int32_t PagePool::refcount(int32_t page) const {
    check_range(page, num_total(), "PagePool.refcount");
    return counts_[static_cast<size_t>(page)];
}

}  // namespace dsgraph
