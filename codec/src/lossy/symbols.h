// The symbol alphabet and the context models of lossy payloads (docs/format.md, "Symbols").
// Written to disk: never change a value.
//
// A quantized value z below kDirectSymbols is its own symbol; a larger z is the symbol of its bit
// length followed by the bits below its leading one in the extra-bits stream; kExactSymbol marks
// an element stored verbatim. A symbol is coded in a context given by the payload's context model.
#pragma once

#include <bit>
#include <cstdint>

#include "entropy/rans.h"

namespace ckpt::lossy {

inline constexpr uint32_t kDirectSymbols = 32;
inline constexpr uint32_t kFirstBucketBits = 6;  // bit length of the smallest bucketed value (32)
inline constexpr uint32_t kMaxBucketBits = 63;
inline constexpr uint8_t kExactSymbol = kDirectSymbols + (kMaxBucketBits - kFirstBucketBits) + 1;
static_assert(kExactSymbol < rans::kMaxSymbols);

// The symbol of a quantized value z (z < 32 itself, else its bit-length bucket), and how many
// extra bits follow it.
inline uint8_t SymbolOf(uint64_t z, uint32_t* extra_bits) {
  if (z < kDirectSymbols) {
    *extra_bits = 0;
    return static_cast<uint8_t>(z);
  }
  const uint32_t bits = static_cast<uint32_t>(std::bit_width(z));
  *extra_bits = bits - 1;
  return static_cast<uint8_t>(kDirectSymbols + bits - kFirstBucketBits);
}

// Context models.
inline constexpr uint8_t kContextModelPrevious2 = 1;  // classes of the two previous symbols
inline constexpr uint8_t kContextModelNone = 2;     // one context (small chunks: tables cost less)
inline constexpr uint8_t kContextModelHistory = 3;  // the element's history state (history.h)
inline constexpr uint32_t kPrevious2Contexts = 9;
inline constexpr uint32_t kHistoryContexts = 8;

inline constexpr uint32_t ContextCount(uint8_t context_model) {
  return context_model == kContextModelPrevious2 ? kPrevious2Contexts
         : context_model == kContextModelHistory ? kHistoryContexts
                                                 : 1;
}

// kContextModelPrevious2: the class of a symbol is 0 (unchanged), 1 (±1 step) or 2 (larger or
// verbatim), and a symbol's context is class(previous) * 3 + class(the one before).
inline uint32_t ClassOf(uint8_t symbol) { return symbol == 0 ? 0 : symbol <= 2 ? 1 : 2; }

}  // namespace ckpt::lossy
