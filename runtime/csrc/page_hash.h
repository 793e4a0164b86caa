// Content keys of cached pages. A page of ratio r covers page_size * r prompt
// tokens; its key chains the key of the page before it with its own tokens
// (key_i = hash_page(key_{i-1}, tokens of page i)), so equal keys mean equal
// whole prefixes, not just equal pages. 64-bit keys are trusted without storing
// the tokens: with n cached pages a collision has probability about n^2 / 2^65.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dsgraph {

// Parent key of a chain's first page.
inline constexpr uint64_t kChainSeed = 0x6473677261706801ull;  // "dsgraph\x01"

// Key of a page holding `tokens` whose previous page has key `parent`.
uint64_t hash_page(uint64_t parent, std::span<const int32_t> tokens);

// Keys of the full pages of `tokens` (tokens_per_page tokens each); a trailing
// partial page has no key. Throws std::invalid_argument unless tokens_per_page > 0.
std::vector<uint64_t> hash_chain(std::span<const int32_t> tokens, int64_t tokens_per_page);

}  // namespace dsgraph
