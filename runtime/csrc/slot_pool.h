// State slots: one per admitted request, holding its SWA rings of every layer
// and its compressor partial state. A slot has one owner at a time, so the pool
// is a plain free list; release of a slot that is not in use is an error (it
// would hand the same slot to two requests later).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace dsgraph {

class SlotPool {
public:
    // Slots 0..num_slots-1, all free. Throws std::invalid_argument unless num_slots > 0.
    explicit SlotPool(int32_t num_slots);

    // The free slot that was released longest ago (slots never used come first,
    // in increasing order); nullopt when every slot is in use.
    std::optional<int32_t> allocate();
    // Throws std::invalid_argument when slot is out of range or not in use.
    void release(int32_t slot);

    bool is_used(int32_t slot) const;
    int32_t num_total() const { return static_cast<int32_t>(used_.size()); }
    int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
    int32_t num_used() const { return num_total() - num_free(); }

private:
    void check_range(int32_t slot, const char *where) const;

    std::deque<int32_t> free_;
    std::vector<uint8_t> used_;
};

}  // namespace dsgraph
