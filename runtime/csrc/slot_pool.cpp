#include "slot_pool.h"

#include <stdexcept>
#include <string>

namespace dsgraph {

SlotPool::SlotPool(int32_t num_slots) {
    if (num_slots <= 0) {
        throw std::invalid_argument("SlotPool: num_slots = " + std::to_string(num_slots) +
                                    " is not positive; expected at least one state slot");
    }
    used_.assign(static_cast<size_t>(num_slots), 0);
    for (int32_t s = 0; s < num_slots; ++s) {
        free_.push_back(s);
    }
}

void SlotPool::check_range(int32_t slot, const char *where) const {
    if (slot < 0 || slot >= num_total()) {
        throw std::invalid_argument(std::string(where) + ": slot " + std::to_string(slot) +
                                    " is outside 0.." + std::to_string(num_total() - 1));
    }
}

std::optional<int32_t> SlotPool::allocate() {
    if (free_.empty()) {
        return std::nullopt;
    }
    const int32_t slot = free_.front();
    free_.pop_front();
    used_[static_cast<size_t>(slot)] = 1;
    return slot;
}

void SlotPool::release(int32_t slot) {
    check_range(slot, "SlotPool.release");
    if (!used_[static_cast<size_t>(slot)]) {
        throw std::invalid_argument("SlotPool.release: slot " + std::to_string(slot) +
                                    " is already free; expected a slot in use");
    }
    used_[static_cast<size_t>(slot)] = 0;
    free_.push_back(slot);
}

bool SlotPool::is_used(int32_t slot) const {
    check_range(slot, "SlotPool.is_used");
    return used_[static_cast<size_t>(slot)] != 0;
}

}  // namespace dsgraph
