#include "page_hash.h"

#include <bit>
#include <stdexcept>
#include <string>

namespace dsgraph {
namespace {

// Odd multipliers with well-spread bits (2^64 / golden ratio, and a second
// constant with no short period); any odd constant keeps the steps bijective.
constexpr uint64_t kMulA = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMulB = 0xD6E8FEB86659FD93ull;

// Bijective finaliser: every input bit reaches every output bit.
uint64_t avalanche(uint64_t x) {
    x ^= x >> 32;
    x *= kMulB;
    x ^= x >> 29;
    x *= kMulA;
    x ^= x >> 32;
    return x;
}

}  // namespace

uint64_t hash_page(uint64_t parent, std::span<const int32_t> tokens) {
    // The length enters first so pages of different sizes never share a key.
    uint64_t h = avalanche(parent ^ (static_cast<uint64_t>(tokens.size()) * kMulA));
    for (const int32_t token : tokens) {
        // Rotate before mixing so a token's position in the page changes its effect.
        h = (std::rotl(h, 23) ^ static_cast<uint32_t>(token)) * kMulA + kMulB;
    }
    return avalanche(h);
}

std::vector<uint64_t> hash_chain(std::span<const int32_t> tokens, int64_t tokens_per_page) {
    if (tokens_per_page <= 0) {
        throw std::invalid_argument("hash_chain: tokens_per_page = " + std::to_string(tokens_per_page) +
                                    " is not positive");
    }
    const size_t per_page = static_cast<size_t>(tokens_per_page);
    std::vector<uint64_t> keys;
    keys.reserve(tokens.size() / per_page);
    uint64_t parent = kChainSeed;
    for (size_t begin = 0; begin + per_page <= tokens.size(); begin += per_page) {
        parent = hash_page(parent, tokens.subspan(begin, per_page));
        keys.push_back(parent);
    }
    return keys;
}

}  // namespace dsgraph
