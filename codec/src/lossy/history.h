// Element history: the persisted bit layout by which a reconstruction carries, in its lowest
// mantissa bits, how its element moved in earlier versions (docs/format.md, "Element history").
// Written to disk: the states, their meaning and the bits they occupy never change.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ckpt/base/dtype.h"

namespace ckpt::lossy {

// Element history (F32 and F64 only). A reconstruction may carry, in the three lowest bits of
// its mantissa, a state describing how the element moved in earlier versions:
//   state = direction * 4 + since, direction 1 = the last move was up, since = versions since
//   that move (0..3, 3 = three or more, or none since the keyframe).
// The next delta's symbol for the element is coded in the context of that state: an element
// that just moved is likely to move again (Adam's momentum), a quiet one to stay. Changing the
// lowest three mantissa bits moves a value by less than 8 units in the last place; a chunk uses
// history only when that is under 1/1024 of its bound, and every element is still checked
// against the bound after its state is written. Zeros are never given a state (they stay exact
// zeros), nor are verbatim elements.
template <DType D>
inline constexpr bool kCanCarryHistory = D == DType::kF32 || D == DType::kF64;
inline constexpr uint32_t kHistoryMask = 7;
inline constexpr uint32_t kKeyframeHistory = 3;  // no direction, quiet for three or more versions

template <DType D>
using ElementBits = std::conditional_t<D == DType::kF64, uint64_t, uint32_t>;

template <DType D>
inline uint32_t HistoryOf(const uint8_t* p) {
  ElementBits<D> bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<uint32_t>(bits & kHistoryMask);
}

// The state a lattice payload (version 3) reads from a reference element: its history bits, or
// kKeyframeHistory ("quiet") for a zero, which carries no state. About a tenth of a trained
// layer's elements sit on the lattice point 0; read as state 0 ("just moved down") they would
// blur that context.
template <DType D>
inline uint32_t LatticeHistoryOf(const uint8_t* p) {
  ElementBits<D> bits;
  std::memcpy(&bits, p, sizeof(bits));
  constexpr ElementBits<D> kMagnitude = ~ElementBits<D>{0} >> 1;
  return (bits & kMagnitude) == 0 ? kKeyframeHistory : static_cast<uint32_t>(bits & kHistoryMask);
}

// Whether an element's IEEE bit pattern can carry a history state: not a zero, not ±Inf or NaN.
template <typename Bits>
inline bool BitsCarryHistory(Bits bits) {
  constexpr Bits kMagnitude = ~Bits{0} >> 1;
  constexpr Bits kExponent =
      static_cast<Bits>(sizeof(Bits) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  return (bits & kMagnitude) != 0 && (bits & kExponent) != kExponent;
}

// `bits` (an element's IEEE bit pattern) with `state` in its history bits, unless it is a zero
// or not finite (±Inf and NaN keep their exact bits). Written as a mask select so that it
// compiles without a branch (which elements move is random).
template <typename Bits>
inline Bits WithHistory(Bits bits, uint32_t state) {
  const bool carries = BitsCarryHistory(bits);
  const Bits keep_mask = static_cast<Bits>(0) - static_cast<Bits>(carries);
  const Bits stuffed = (bits & ~Bits{kHistoryMask}) | state;
  return (stuffed & keep_mask) | (bits & ~keep_mask);
}

// Whether a stored element carries a history state (it is neither a zero nor non-finite).
template <DType D>
inline bool CarriesHistory(const uint8_t* p) {
  ElementBits<D> bits;
  std::memcpy(&bits, p, sizeof(bits));
  return BitsCarryHistory(bits);
}

// Writes `state` into a stored element unless it is a zero or not finite.
template <DType D>
inline void SetHistory(uint8_t* p, uint32_t state) {
  ElementBits<D> bits;
  std::memcpy(&bits, p, sizeof(bits));
  bits = WithHistory(bits, state);
  std::memcpy(p, &bits, sizeof(bits));
}

// The state after a version in which the element moved by `moved` (0: did not move). Also a
// mask select, for the same reason.
inline uint32_t NextHistory(uint32_t state, double moved) {
  const uint32_t since = state & 3;
  const uint32_t quiet = (state & 4) | (since + (since != 3));
  const uint32_t moved_state = static_cast<uint32_t>(moved > 0) << 2;
  const uint32_t did_move = 0u - static_cast<uint32_t>(moved != 0);
  return (moved_state & did_move) | (quiet & ~did_move);
}

// Whether a chunk of dtype D whose values are at most `max_abs` in magnitude can carry history
// under `bound`: 8 units in the last place of the largest value must be below bound / 1024.
template <DType D>
bool HistoryFits(double max_abs, double bound) {
  if (!kCanCarryHistory<D> || !(bound > 0) || !std::isfinite(max_abs) || !std::isfinite(bound)) {
    return false;
  }
  int exponent = 0;
  std::frexp(max_abs, &exponent);  // max_abs < 2^exponent
  constexpr int kMantissaBits = D == DType::kF64 ? 52 : 23;
  // ulp(max_abs) <= 2^(exponent - 1 - kMantissaBits); 8 ulp * 1024 = 2^13 ulp.
  return bound >= std::ldexp(1.0, exponent - 1 - kMantissaBits + 13);
}

}  // namespace ckpt::lossy
