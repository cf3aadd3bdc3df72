// Element access, element history and the SSE2 kernels of the lossy codec (internal to
// codec/; lossy_codec.cc is the only user). docs/format.md specifies the arithmetic; everything
// here computes exactly what the general per-element code in lossy_codec.cc computes.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ckpt/codec/dtype.h"

namespace ckpt::lossy {

// Quantized values z below this are their own symbol (larger ones are bucketed).
inline constexpr uint32_t kDirectSymbols = 32;

// Element access for each supported dtype: load to double, store from double (one rounding).
template <DType D>
struct Element;

// The dtypes that are C++ types: load by conversion, store by one rounding.
template <typename T>
struct NativeElement {
  static constexpr size_t kSize = sizeof(T);
  static double Load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return static_cast<double>(v);
  }
  static void Store(double v, uint8_t* p) {
    const T t = static_cast<T>(v);
    std::memcpy(p, &t, sizeof(T));
  }
};

template <>
struct Element<DType::kF32> : NativeElement<float> {};
template <>
struct Element<DType::kF64> : NativeElement<double> {};
// IEEE binary16 without a native half type (clang before 15 has no _Float16 on x86-64). The
// conversions are the exact ones a native type performs: a load is exact, a store rounds once,
// to nearest even, with overflow to ±Inf. NaN loads keep their payload, quieted.
inline double HalfBitsToDouble(uint16_t h) {
  const uint64_t sign = uint64_t{h} >> 15 << 63;
  const int exponent = (h >> 10) & 0x1f;
  const uint64_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) {
    const uint64_t quiet = mantissa != 0 ? uint64_t{1} << 51 : 0;
    return std::bit_cast<double>(sign | uint64_t{0x7ff} << 52 | mantissa << 42 | quiet);
  }
  const double magnitude = exponent == 0
                               ? std::ldexp(static_cast<double>(mantissa), -24)
                               : std::ldexp(static_cast<double>(mantissa | 0x400), exponent - 25);
  return std::bit_cast<double>(std::bit_cast<uint64_t>(magnitude) | sign);
}

inline uint16_t DoubleToHalfBits(double v) {
  const auto sign = static_cast<uint16_t>(std::bit_cast<uint64_t>(v) >> 48 & 0x8000);
  if (std::isnan(v)) {
    return static_cast<uint16_t>(sign | 0x7e00 | (std::bit_cast<uint64_t>(v) >> 42 & 0x1ff));
  }
  const double a = std::fabs(v);
  if (a < 0x1p-14) {  // subnormal (or zero): multiples of 2^-24; 0x400 is the smallest normal
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24)));
  }
  if (std::isinf(a)) return static_cast<uint16_t>(sign | 0x7c00);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  auto mantissa = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 11 - e)));  // [1024, 2048]
  int biased = e - 1 + 15;
  if (mantissa == 2048) {
    mantissa = 1024;
    biased += 1;
  }
  if (biased >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);
  return static_cast<uint16_t>(sign | biased << 10 | (mantissa - 1024));
}

struct SoftwareHalfElement {
  static constexpr size_t kSize = 2;
  static double Load(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return HalfBitsToDouble(h);
  }
  static void Store(double v, uint8_t* p) {
    const uint16_t h = DoubleToHalfBits(v);
    std::memcpy(p, &h, 2);
  }
};

#if defined(__FLT16_MANT_DIG__)
template <>
struct Element<DType::kF16> : NativeElement<_Float16> {};
#else
template <>
struct Element<DType::kF16> : SoftwareHalfElement {};
#endif

template <>
struct Element<DType::kBF16> {
  static constexpr size_t kSize = 2;
  static double Load(const uint8_t* p) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return std::bit_cast<float>(uint32_t{b} << 16);
  }
  // double -> float -> bfloat16, round to nearest even at each step (NaN never reaches here:
  // non-finite elements are stored verbatim).
  static void Store(double v, uint8_t* p) {
    uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
    bits += 0x7fff + ((bits >> 16) & 1);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(p, &b, 2);
  }
};

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

#if defined(__SSE2__)
// 32-bit lane masks from two 64-bit lane masks (lanes 0-1 from lo, 2-3 from hi).
inline __m128i PackMasks(__m128d lo, __m128d hi) {
  return _mm_castps_si128(
      _mm_shuffle_ps(_mm_castpd_ps(lo), _mm_castpd_ps(hi), _MM_SHUFFLE(2, 0, 2, 0)));
}

// RoundToInteger(v) + 0.0 for two lanes (quantizers.h: exact for |v| < 2^51, ties to even).
inline __m128d RoundToIntegerTwo(__m128d v) {
  const __m128d magic = _mm_set1_pd(0x1.8p52);
  return _mm_add_pd(_mm_sub_pd(_mm_add_pd(v, magic), magic), _mm_setzero_pd());
}

// The four direct symbols of `four` (one per byte) as 32-bit lanes q = unzigzag(z) =
// (z >> 1) ^ -(z & 1).
inline __m128i UnzigzagFour(uint32_t four) {
  const __m128i zero = _mm_setzero_si128();
  const __m128i z =
      _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(static_cast<int>(four)), zero), zero);
  return _mm_xor_si128(_mm_srli_epi32(z, 1),
                       _mm_sub_epi32(zero, _mm_and_si128(z, _mm_set1_epi32(1))));
}

// NextHistory for four lanes: `state` the states before, `value_lo`/`value_hi` the moves.
inline __m128i NextHistoryFour(__m128i state, __m128d value_lo, __m128d value_hi) {
  const __m128d zero = _mm_setzero_pd();
  const __m128i up = PackMasks(_mm_cmpgt_pd(value_lo, zero), _mm_cmpgt_pd(value_hi, zero));
  const __m128i moved = PackMasks(_mm_cmpneq_pd(value_lo, zero), _mm_cmpneq_pd(value_hi, zero));
  const __m128i since = _mm_and_si128(state, _mm_set1_epi32(3));
  // since + (since != 3) == since + 1 + (since == 3 ? -1 : 0)
  const __m128i next_since = _mm_add_epi32(_mm_add_epi32(since, _mm_set1_epi32(1)),
                                           _mm_cmpeq_epi32(since, _mm_set1_epi32(3)));
  const __m128i quiet = _mm_or_si128(_mm_and_si128(state, _mm_set1_epi32(4)), next_since);
  const __m128i moved_state = _mm_and_si128(up, _mm_set1_epi32(4));
  return _mm_or_si128(_mm_and_si128(moved, moved_state), _mm_andnot_si128(moved, quiet));
}

// LatticeHistoryOf for four F32 lanes.
inline __m128i LatticeStateFour(__m128i ref_bits) {
  const __m128i zero =
      _mm_cmpeq_epi32(_mm_and_si128(ref_bits, _mm_set1_epi32(0x7fffffff)), _mm_setzero_si128());
  const __m128i state = _mm_and_si128(ref_bits, _mm_set1_epi32(kHistoryMask));
  return _mm_or_si128(_mm_and_si128(zero, _mm_set1_epi32(kKeyframeHistory)),
                      _mm_andnot_si128(zero, state));
}

// WithHistory for four F32 lanes.
inline __m128i WithHistoryFour(__m128i bits, __m128i state) {
  const __m128i exponent = _mm_set1_epi32(0x7f800000);
  const __m128i keep = _mm_or_si128(
      _mm_cmpeq_epi32(_mm_and_si128(bits, _mm_set1_epi32(0x7fffffff)), _mm_setzero_si128()),
      _mm_cmpeq_epi32(_mm_and_si128(bits, exponent), exponent));
  const __m128i stuffed = _mm_or_si128(_mm_andnot_si128(_mm_set1_epi32(kHistoryMask), bits), state);
  return _mm_or_si128(_mm_and_si128(keep, bits), _mm_andnot_si128(keep, stuffed));
}

// Writes four elements a fast path accepted: their reconstructions `bits`, their symbols
// zigzag(q) (|q| <= 15) and the history states before, one byte each.
inline void StoreFourAccepted(__m128i bits, __m128d q_lo, __m128d q_hi, __m128i state,
                              uint8_t* recon, uint8_t* symbols, uint8_t* history) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(recon), bits);
  const __m128i q = _mm_unpacklo_epi64(_mm_cvtpd_epi32(q_lo), _mm_cvtpd_epi32(q_hi));
  const __m128i zigzag = _mm_xor_si128(_mm_slli_epi32(q, 1), _mm_srai_epi32(q, 31));
  auto bytes = [](__m128i v) {
    const __m128i words = _mm_packs_epi32(v, v);
    return static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(words, words)));
  };
  const uint32_t symbol_bytes = bytes(zigzag), state_bytes = bytes(state);
  std::memcpy(symbols, &symbol_bytes, 4);
  std::memcpy(history, &state_bytes, 4);
}

// The encoder's fast path (see QuantizeElementsImpl) for four F32 elements of a history delta
// under the uniform quantizer, with the same arithmetic. Returns false, having written nothing,
// unless all four take it.
inline bool QuantizeFourF32(const uint8_t* in, const uint8_t* ref, double step, double inverse_step,
                            double bound, bool non_negative, uint8_t* recon, uint8_t* symbols,
                            uint8_t* history) {
  const __m128 x = _mm_loadu_ps(reinterpret_cast<const float*>(in));
  const __m128i ref_bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ref));
  const __m128 p = _mm_castsi128_ps(ref_bits);
  const __m128d x_lo = _mm_cvtps_pd(x), x_hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
  const __m128d p_lo = _mm_cvtps_pd(p), p_hi = _mm_cvtps_pd(_mm_movehl_ps(p, p));
  const __m128d inv = _mm_set1_pd(inverse_step);
  const __m128d t_lo = _mm_mul_pd(_mm_sub_pd(x_lo, p_lo), inv);
  const __m128d t_hi = _mm_mul_pd(_mm_sub_pd(x_hi, p_hi), inv);
  const __m128d dzero = _mm_setzero_pd();
  const __m128d q_lo = RoundToIntegerTwo(t_lo), q_hi = RoundToIntegerTwo(t_hi);
  const __m128d step2 = _mm_set1_pd(step);
  const __m128d value_lo = _mm_mul_pd(q_lo, step2), value_hi = _mm_mul_pd(q_hi, step2);
  const __m128i rounded = _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(_mm_add_pd(p_lo, value_lo)),
                                                         _mm_cvtpd_ps(_mm_add_pd(p_hi, value_hi))));
  const __m128i state = _mm_and_si128(ref_bits, _mm_set1_epi32(kHistoryMask));
  const __m128i bits = WithHistoryFour(rounded, NextHistoryFour(state, value_lo, value_hi));
  const __m128 r = _mm_castsi128_ps(bits);
  const __m128d r_lo = _mm_cvtps_pd(r), r_hi = _mm_cvtps_pd(_mm_movehl_ps(r, r));
  const __m128d abs_mask = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffff));
  const __m128d direct = _mm_set1_pd(kDirectSymbols / 2 - 0.5);
  const __m128d bound2 = _mm_set1_pd(bound);
  auto lane_ok = [&](__m128d t, __m128d xd, __m128d rd) {
    return _mm_and_pd(_mm_and_pd(_mm_cmplt_pd(_mm_and_pd(t, abs_mask), direct),
                                 _mm_cmplt_pd(_mm_and_pd(_mm_sub_pd(xd, rd), abs_mask), bound2)),
                      _mm_cmpneq_pd(xd, dzero));
  };
  __m128i ok = PackMasks(lane_ok(t_lo, x_lo, r_lo), lane_ok(t_hi, x_hi, r_hi));
  if (non_negative) ok = _mm_and_si128(ok, _mm_cmpgt_epi32(bits, _mm_set1_epi32(-1)));
  if (_mm_movemask_ps(_mm_castsi128_ps(ok)) != 0xf) return false;
  StoreFourAccepted(bits, q_lo, q_hi, state, recon, symbols, history);
  return true;
}
#endif

#if defined(__SSE2__)
// The fast path of QuantizeLatticeElements for four F32 elements (`ref` null: a keyframe), with
// the same arithmetic. With kHistory the reconstructions carry their next history state
// (kKeyframeHistory in keyframes) and, in deltas, the states before go to `history`. Returns
// false, having written nothing, unless all four take it.
template <bool kExactTarget, bool kHistory = false>
inline bool QuantizeFourLatticeF32(const uint8_t* in, const uint8_t* ref, double step,
                                   double inverse_step, double bound, bool non_negative,
                                   uint8_t* recon, uint8_t* symbols, uint8_t* history = nullptr) {
  static_assert(!(kExactTarget && kHistory), "exact targets carry their history explicitly");
  const __m128i x_bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
  const __m128 x = _mm_castsi128_ps(x_bits);
  const __m128 p = ref ? _mm_loadu_ps(reinterpret_cast<const float*>(ref)) : _mm_setzero_ps();
  const __m128d x_lo = _mm_cvtps_pd(x), x_hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
  const __m128d inv = _mm_set1_pd(inverse_step);
  const __m128d pt_lo = _mm_mul_pd(_mm_cvtps_pd(p), inv);
  const __m128d pt_hi = _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(p, p)), inv);
  const __m128d t_lo = _mm_mul_pd(x_lo, inv), t_hi = _mm_mul_pd(x_hi, inv);
  const __m128d dzero = _mm_setzero_pd();
  const __m128d kp_lo = RoundToIntegerTwo(pt_lo), kp_hi = RoundToIntegerTwo(pt_hi);
  const __m128d q_lo = _mm_sub_pd(RoundToIntegerTwo(t_lo), kp_lo);
  const __m128d q_hi = _mm_sub_pd(RoundToIntegerTwo(t_hi), kp_hi);
  const __m128d step2 = _mm_set1_pd(step);
  const __m128i lattice_bits =
      _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(_mm_mul_pd(_mm_add_pd(kp_lo, q_lo), step2)),
                                     _mm_cvtpd_ps(_mm_mul_pd(_mm_add_pd(kp_hi, q_hi), step2))));
  __m128i state = _mm_set1_epi32(kKeyframeHistory);
  __m128i bits = lattice_bits;
  if constexpr (kHistory) {
    if (ref) state = LatticeStateFour(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ref)));
    bits = WithHistoryFour(
        lattice_bits, ref ? NextHistoryFour(state, q_lo, q_hi) : _mm_set1_epi32(kKeyframeHistory));
  }
  const __m128 r = _mm_castsi128_ps(bits);
  const __m128d abs_mask = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffff));
  const __m128d max_index = _mm_set1_pd(0x1p50);
  const __m128d direct = _mm_set1_pd(kDirectSymbols / 2 - 0.5);
  auto lane_ok = [&](__m128d pt, __m128d t, __m128d q) {
    return _mm_and_pd(_mm_and_pd(_mm_cmple_pd(_mm_and_pd(pt, abs_mask), max_index),
                                 _mm_cmple_pd(_mm_and_pd(t, abs_mask), max_index)),
                      _mm_cmplt_pd(_mm_and_pd(q, abs_mask), direct));
  };
  __m128i ok = PackMasks(lane_ok(pt_lo, t_lo, q_lo), lane_ok(pt_hi, t_hi, q_hi));
  if constexpr (kExactTarget) {
    (void)bound;
    (void)non_negative;
    ok = _mm_and_si128(ok, _mm_cmpeq_epi32(bits, x_bits));
  } else {
    const __m128d r_lo = _mm_cvtps_pd(r), r_hi = _mm_cvtps_pd(_mm_movehl_ps(r, r));
    const __m128d bound2 = _mm_set1_pd(bound);
    auto close = [&](__m128d xd, __m128d rd) {
      return _mm_and_pd(_mm_cmplt_pd(_mm_and_pd(_mm_sub_pd(xd, rd), abs_mask), bound2),
                        _mm_cmpneq_pd(xd, dzero));
    };
    ok = _mm_and_si128(ok, PackMasks(close(x_lo, r_lo), close(x_hi, r_hi)));
    if (non_negative) ok = _mm_and_si128(ok, _mm_cmpgt_epi32(bits, _mm_set1_epi32(-1)));
  }
  if (_mm_movemask_ps(_mm_castsi128_ps(ok)) != 0xf) return false;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(recon), bits);
  const __m128i q = _mm_unpacklo_epi64(_mm_cvtpd_epi32(q_lo), _mm_cvtpd_epi32(q_hi));
  const __m128i zigzag = _mm_xor_si128(_mm_slli_epi32(q, 1), _mm_srai_epi32(q, 31));
  const __m128i words = _mm_packs_epi32(zigzag, zigzag);
  const uint32_t symbol_bytes =
      static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(words, words)));
  std::memcpy(symbols, &symbol_bytes, 4);
  if constexpr (kHistory) {
    if (ref) {
      const __m128i state_words = _mm_packs_epi32(state, state);
      const uint32_t state_bytes =
          static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(state_words, state_words)));
      std::memcpy(history, &state_bytes, 4);
    }
  }
  return true;
}

// The lattice indices RoundToInteger(p * inverse) + 0.0 of four F32 references, or false when
// one has none (not finite, or beyond 2^50 pitches).
inline bool LatticeIndicesFour(__m128 p, double inverse, __m128d* kp_lo, __m128d* kp_hi) {
  const __m128d inv = _mm_set1_pd(inverse);
  const __m128d pt_lo = _mm_mul_pd(_mm_cvtps_pd(p), inv);
  const __m128d pt_hi = _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(p, p)), inv);
  const __m128d abs_mask = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffff));
  const __m128d max_index = _mm_set1_pd(0x1p50);
  const __m128d indexed = _mm_and_pd(_mm_cmple_pd(_mm_and_pd(pt_lo, abs_mask), max_index),
                                     _mm_cmple_pd(_mm_and_pd(pt_hi, abs_mask), max_index));
  if (_mm_movemask_pd(indexed) != 3) return false;
  *kp_lo = RoundToIntegerTwo(pt_lo);
  *kp_hi = RoundToIntegerTwo(pt_hi);
  return true;
}

// Four F32 elements of a lattice payload, all with direct symbols (`four`, one per byte),
// exactly as the general loop decodes them: kp = RoundToInteger(p * inverse_step) + 0.0, one
// rounding of (kp + q) * step to float, and with kHistory the next history state written into
// it (NextHistory of the reference's state and q; kKeyframeHistory in keyframes). Returns false,
// having written nothing, when a reference has no lattice index (then the general loop decodes
// the four).
template <bool kHistory = false>
inline bool DecodeFourLatticeF32(uint32_t four, double step, double inverse_step,
                                 const uint8_t* ref, uint8_t* out) {
  const __m128 p = ref ? _mm_loadu_ps(reinterpret_cast<const float*>(ref)) : _mm_setzero_ps();
  __m128d kp_lo, kp_hi;
  if (!LatticeIndicesFour(p, inverse_step, &kp_lo, &kp_hi)) return false;
  const __m128i q = UnzigzagFour(four);
  const __m128d step2 = _mm_set1_pd(step);
  const __m128d q_lo = _mm_cvtepi32_pd(q), q_hi = _mm_cvtepi32_pd(_mm_shuffle_epi32(q, 0xee));
  const __m128d r_lo = _mm_mul_pd(_mm_add_pd(kp_lo, q_lo), step2);
  const __m128d r_hi = _mm_mul_pd(_mm_add_pd(kp_hi, q_hi), step2);
  __m128i bits = _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(r_lo), _mm_cvtpd_ps(r_hi)));
  if constexpr (kHistory) {
    const __m128i next =
        ref ? NextHistoryFour(
                  LatticeStateFour(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ref))), q_lo,
                  q_hi)
            : _mm_set1_epi32(kKeyframeHistory);
    bits = WithHistoryFour(bits, next);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bits);
  return true;
}

// The low-rank lattice (lossy_codec.cc, QuantizeLowRankElement) for four F32 elements of a
// delta with history, with the same arithmetic: kp = RoundToInteger(p / fine) + 0.0, base =
// kp + shift, q = RoundToInteger((x / fine - base) / 64) + 0.0, the reconstruction (base + 64 q)
// * fine rounded once to float and carrying NextHistory of the reference's state and q. Returns
// false, having written nothing, unless all four are indexed, direct, strictly within the
// bound, not zero and (in non-negative chunks) not negative.
inline bool QuantizeFourLowRankF32(const uint8_t* in, const uint8_t* ref, const int32_t* shift,
                                   double fine, double inverse_fine, double bound,
                                   bool non_negative, uint8_t* recon, uint8_t* symbols,
                                   uint8_t* history) {
  const __m128 x = _mm_loadu_ps(reinterpret_cast<const float*>(in));
  const __m128i ref_bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ref));
  const __m128 p = _mm_castsi128_ps(ref_bits);
  const __m128d x_lo = _mm_cvtps_pd(x), x_hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
  const __m128d inv = _mm_set1_pd(inverse_fine);
  const __m128d pt_lo = _mm_mul_pd(_mm_cvtps_pd(p), inv);
  const __m128d pt_hi = _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(p, p)), inv);
  const __m128d t_lo = _mm_mul_pd(x_lo, inv), t_hi = _mm_mul_pd(x_hi, inv);
  const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(shift));
  const __m128d base_lo = _mm_add_pd(RoundToIntegerTwo(pt_lo), _mm_cvtepi32_pd(s));
  const __m128d base_hi =
      _mm_add_pd(RoundToIntegerTwo(pt_hi), _mm_cvtepi32_pd(_mm_shuffle_epi32(s, 0xee)));
  const __m128d sixty_fourth = _mm_set1_pd(1.0 / 64);
  const __m128d q_lo = RoundToIntegerTwo(_mm_mul_pd(_mm_sub_pd(t_lo, base_lo), sixty_fourth));
  const __m128d q_hi = RoundToIntegerTwo(_mm_mul_pd(_mm_sub_pd(t_hi, base_hi), sixty_fourth));
  const __m128d move = _mm_set1_pd(64), fine2 = _mm_set1_pd(fine);
  const __m128d r_lo = _mm_mul_pd(_mm_add_pd(base_lo, _mm_mul_pd(move, q_lo)), fine2);
  const __m128d r_hi = _mm_mul_pd(_mm_add_pd(base_hi, _mm_mul_pd(move, q_hi)), fine2);
  const __m128i lattice_bits =
      _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(r_lo), _mm_cvtpd_ps(r_hi)));
  const __m128i state = LatticeStateFour(ref_bits);
  const __m128i bits = WithHistoryFour(lattice_bits, NextHistoryFour(state, q_lo, q_hi));
  const __m128 r = _mm_castsi128_ps(bits);
  const __m128d abs_mask = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffff));
  const __m128d max_index = _mm_set1_pd(0x1p50);
  const __m128d direct = _mm_set1_pd(kDirectSymbols / 2 - 0.5);
  const __m128d bound2 = _mm_set1_pd(bound);
  auto lane_ok = [&](__m128d pt, __m128d t, __m128d q, __m128d xd, __m128d rd) {
    const __m128d indexed = _mm_and_pd(_mm_cmple_pd(_mm_and_pd(pt, abs_mask), max_index),
                                       _mm_cmple_pd(_mm_and_pd(t, abs_mask), max_index));
    const __m128d close = _mm_and_pd(_mm_cmplt_pd(_mm_and_pd(_mm_sub_pd(xd, rd), abs_mask), bound2),
                                     _mm_cmpneq_pd(xd, _mm_setzero_pd()));
    return _mm_and_pd(_mm_and_pd(indexed, close), _mm_cmplt_pd(_mm_and_pd(q, abs_mask), direct));
  };
  __m128i ok = PackMasks(lane_ok(pt_lo, t_lo, q_lo, x_lo, _mm_cvtps_pd(r)),
                         lane_ok(pt_hi, t_hi, q_hi, x_hi, _mm_cvtps_pd(_mm_movehl_ps(r, r))));
  if (non_negative) ok = _mm_and_si128(ok, _mm_cmpgt_epi32(bits, _mm_set1_epi32(-1)));
  if (_mm_movemask_ps(_mm_castsi128_ps(ok)) != 0xf) return false;
  StoreFourAccepted(bits, q_lo, q_hi, state, recon, symbols, history);
  return true;
}

// Four F32 elements of a low-rank lattice payload, all with direct symbols, exactly as the
// general loop decodes them: (kp + shift + 64 q) * fine rounded once to float, with the next
// history state. Returns false, having written nothing, when a reference has no index.
inline bool DecodeFourLowRankF32(uint32_t four, double fine, double inverse_fine,
                                 const int32_t* shift, const uint8_t* ref, uint8_t* out) {
  const __m128i ref_bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ref));
  __m128d kp_lo, kp_hi;
  if (!LatticeIndicesFour(_mm_castsi128_ps(ref_bits), inverse_fine, &kp_lo, &kp_hi)) return false;
  const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(shift));
  const __m128d base_lo = _mm_add_pd(kp_lo, _mm_cvtepi32_pd(s));
  const __m128d base_hi = _mm_add_pd(kp_hi, _mm_cvtepi32_pd(_mm_shuffle_epi32(s, 0xee)));
  const __m128i q = UnzigzagFour(four);
  const __m128d q_lo = _mm_cvtepi32_pd(q), q_hi = _mm_cvtepi32_pd(_mm_shuffle_epi32(q, 0xee));
  const __m128d move = _mm_set1_pd(64), fine2 = _mm_set1_pd(fine);
  const __m128d r_lo = _mm_mul_pd(_mm_add_pd(base_lo, _mm_mul_pd(move, q_lo)), fine2);
  const __m128d r_hi = _mm_mul_pd(_mm_add_pd(base_hi, _mm_mul_pd(move, q_hi)), fine2);
  const __m128i bits = _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(r_lo), _mm_cvtpd_ps(r_hi)));
  const __m128i next = NextHistoryFour(LatticeStateFour(ref_bits), q_lo, q_hi);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), WithHistoryFour(bits, next));
  return true;
}

// Four F32 elements of a history delta under the uniform quantizer, all with direct symbols
// (`four`, one per byte): exactly the arithmetic of the general loop (value = q * step in double,
// the sum with the reference in double, one rounding to float, NextHistory, WithHistory), four
// at a time.
inline void DecodeFourDirectF32(uint32_t four, double step, const uint8_t* ref, uint8_t* out) {
  const __m128i q = UnzigzagFour(four);
  const __m128d step2 = _mm_set1_pd(step);
  const __m128d value_lo = _mm_mul_pd(_mm_cvtepi32_pd(q), step2);
  const __m128d value_hi = _mm_mul_pd(_mm_cvtepi32_pd(_mm_shuffle_epi32(q, 0xee)), step2);
  const __m128i ref_bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ref));
  const __m128 p = _mm_castsi128_ps(ref_bits);
  const __m128d sum_lo = _mm_add_pd(_mm_cvtps_pd(p), value_lo);
  const __m128d sum_hi = _mm_add_pd(_mm_cvtps_pd(_mm_movehl_ps(p, p)), value_hi);
  const __m128i bits = _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(sum_lo), _mm_cvtpd_ps(sum_hi)));
  const __m128i state = _mm_and_si128(ref_bits, _mm_set1_epi32(kHistoryMask));
  const __m128i next = NextHistoryFour(state, value_lo, value_hi);
  const __m128i result = WithHistoryFour(bits, next);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), result);
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define CKPT_LOSSY_AVX2 1
}  // namespace ckpt::lossy
#include <immintrin.h>
namespace ckpt::lossy {
// AVX2 versions of the low-rank lattice's encoder kernel, for CPUs that have it (the caller
// checks): eight F32 elements at a time, four double lanes per register, with exactly the
// arithmetic of QuantizeFourLowRankF32.

// RoundToInteger(v) + 0.0 for four lanes.
__attribute__((target("avx2"), always_inline)) inline __m256d RoundToIntegerFour(__m256d v) {
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  return _mm256_add_pd(_mm256_sub_pd(_mm256_add_pd(v, magic), magic), _mm256_setzero_pd());
}

// The low byte of each 32-bit lane of v (each within 0 .. 255) into out[0 .. 8).
__attribute__((target("avx2"), always_inline)) inline void StoreLowBytesEight(__m256i v,
                                                                              uint8_t* out) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const __m128i words = _mm_packs_epi32(lo, hi);
  const __m128i bytes = _mm_packus_epi16(words, words);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
}

// LatticeHistoryOf for eight F32 lanes.
__attribute__((target("avx2"), always_inline)) inline __m256i LatticeStateEight(__m256i ref_bits) {
  const __m256i zero = _mm256_cmpeq_epi32(_mm256_and_si256(ref_bits, _mm256_set1_epi32(0x7fffffff)),
                                          _mm256_setzero_si256());
  return _mm256_or_si256(
      _mm256_and_si256(zero, _mm256_set1_epi32(kKeyframeHistory)),
      _mm256_andnot_si256(zero, _mm256_and_si256(ref_bits, _mm256_set1_epi32(kHistoryMask))));
}

// NextHistory for eight lanes: `state` the states before, q the moves (as int32).
__attribute__((target("avx2"), always_inline)) inline __m256i NextHistoryEight(__m256i state,
                                                                               __m256i q) {
  const __m256i up = _mm256_cmpgt_epi32(q, _mm256_setzero_si256());
  const __m256i still = _mm256_cmpeq_epi32(q, _mm256_setzero_si256());
  const __m256i since = _mm256_and_si256(state, _mm256_set1_epi32(3));
  const __m256i next_since = _mm256_add_epi32(_mm256_add_epi32(since, _mm256_set1_epi32(1)),
                                              _mm256_cmpeq_epi32(since, _mm256_set1_epi32(3)));
  const __m256i quiet = _mm256_or_si256(_mm256_and_si256(state, _mm256_set1_epi32(4)), next_since);
  return _mm256_or_si256(_mm256_and_si256(still, quiet),
                         _mm256_andnot_si256(still, _mm256_and_si256(up, _mm256_set1_epi32(4))));
}

// WithHistory for eight F32 lanes.
__attribute__((target("avx2"), always_inline)) inline __m256i WithHistoryEight(__m256i bits,
                                                                               __m256i state) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  const __m256i keep =
      _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_setzero_si256()),
                      _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent));
  const __m256i stuffed =
      _mm256_or_si256(_mm256_andnot_si256(_mm256_set1_epi32(kHistoryMask), bits), state);
  return _mm256_or_si256(_mm256_and_si256(keep, bits), _mm256_andnot_si256(keep, stuffed));
}

__attribute__((target("avx2"), always_inline)) inline bool QuantizeEightLowRankF32(
    const uint8_t* in, const uint8_t* ref, const int32_t* shift, double fine, double inverse_fine,
    double bound, bool non_negative, uint8_t* recon, uint8_t* symbols, uint8_t* history) {
  const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(in));
  const __m256i ref_bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ref));
  const __m256 p = _mm256_castsi256_ps(ref_bits);
  const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(shift));
  const __m256d inv = _mm256_set1_pd(inverse_fine), fine4 = _mm256_set1_pd(fine);
  const __m256d sixty_fourth = _mm256_set1_pd(1.0 / 64), move = _mm256_set1_pd(64);
  __m256d xd[2], pt[2], t[2], q[2];
  __m128 lattice[2];
  for (int h = 0; h < 2; ++h) {
    const __m128 x_half = h ? _mm256_extractf128_ps(x, 1) : _mm256_castps256_ps128(x);
    const __m128 p_half = h ? _mm256_extractf128_ps(p, 1) : _mm256_castps256_ps128(p);
    const __m128i s_half = h ? _mm256_extracti128_si256(s, 1) : _mm256_castsi256_si128(s);
    xd[h] = _mm256_cvtps_pd(x_half);
    pt[h] = _mm256_mul_pd(_mm256_cvtps_pd(p_half), inv);
    t[h] = _mm256_mul_pd(xd[h], inv);
    const __m256d base = _mm256_add_pd(RoundToIntegerFour(pt[h]), _mm256_cvtepi32_pd(s_half));
    q[h] = RoundToIntegerFour(_mm256_mul_pd(_mm256_sub_pd(t[h], base), sixty_fourth));
    lattice[h] =
        _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_add_pd(base, _mm256_mul_pd(move, q[h])), fine4));
  }
  const __m256i lattice_bits =
      _mm256_castps_si256(_mm256_insertf128_ps(_mm256_castps128_ps256(lattice[0]), lattice[1], 1));
  // Only lanes that pass the checks below are stored, and those have |q| <= 15, so q as an
  // int32 decides the move's direction.
  const __m256i q32 = _mm256_insertf128_si256(_mm256_castsi128_si256(_mm256_cvtpd_epi32(q[0])),
                                              _mm256_cvtpd_epi32(q[1]), 1);
  const __m256i state = LatticeStateEight(ref_bits);
  const __m256i bits = WithHistoryEight(lattice_bits, NextHistoryEight(state, q32));
  // The checks of QuantizeFourLowRankF32, on the reconstruction as stored.
  const __m256 r = _mm256_castsi256_ps(bits);
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
  const __m256d max_index = _mm256_set1_pd(0x1p50);
  const __m256d direct = _mm256_set1_pd(kDirectSymbols / 2 - 0.5);
  const __m256d bound4 = _mm256_set1_pd(bound);
  for (int h = 0; h < 2; ++h) {
    const __m256d rd = _mm256_cvtps_pd(h ? _mm256_extractf128_ps(r, 1) : _mm256_castps256_ps128(r));
    const __m256d indexed =
        _mm256_and_pd(_mm256_cmp_pd(_mm256_and_pd(pt[h], abs_mask), max_index, _CMP_LE_OQ),
                      _mm256_cmp_pd(_mm256_and_pd(t[h], abs_mask), max_index, _CMP_LE_OQ));
    const __m256d close = _mm256_and_pd(
        _mm256_cmp_pd(_mm256_and_pd(_mm256_sub_pd(xd[h], rd), abs_mask), bound4, _CMP_LT_OQ),
        _mm256_cmp_pd(xd[h], _mm256_setzero_pd(), _CMP_NEQ_UQ));
    const __m256d small = _mm256_cmp_pd(_mm256_and_pd(q[h], abs_mask), direct, _CMP_LT_OQ);
    if (_mm256_movemask_pd(_mm256_and_pd(_mm256_and_pd(indexed, close), small)) != 0xf) {
      return false;
    }
  }
  if (non_negative && _mm256_movemask_ps(_mm256_castsi256_ps(
                          _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(-1)))) != 0xff) {
    return false;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(recon), bits);
  const __m256i zigzag = _mm256_xor_si256(_mm256_slli_epi32(q32, 1), _mm256_srai_epi32(q32, 31));
  StoreLowBytesEight(zigzag, symbols);
  StoreLowBytesEight(state, history);
  return true;
}
// DecodeFourLowRankF32 for eight elements, all with direct symbols (`eight`, one per byte):
// (kp + shift + 64 q) * fine rounded once to float, with the next history state. Returns false,
// having written nothing, when a reference has no index.
__attribute__((target("avx2"), always_inline)) inline bool DecodeEightLowRankF32(
    uint64_t eight, double fine, double inverse_fine, const int32_t* shift, const uint8_t* ref,
    uint8_t* out) {
  const __m256i ref_bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ref));
  const __m256 p = _mm256_castsi256_ps(ref_bits);
  const __m256d inv = _mm256_set1_pd(inverse_fine), max_index = _mm256_set1_pd(0x1p50);
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
  __m256d kp[2];
  for (int h = 0; h < 2; ++h) {
    const __m256d pt = _mm256_mul_pd(
        _mm256_cvtps_pd(h ? _mm256_extractf128_ps(p, 1) : _mm256_castps256_ps128(p)), inv);
    const __m256d indexed = _mm256_cmp_pd(_mm256_and_pd(pt, abs_mask), max_index, _CMP_LE_OQ);
    if (_mm256_movemask_pd(indexed) != 0xf) return false;
    kp[h] = RoundToIntegerFour(pt);
  }
  const __m256i z = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(eight)));
  const __m256i q = _mm256_xor_si256(
      _mm256_srli_epi32(z, 1),
      _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(z, _mm256_set1_epi32(1))));
  const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(shift));
  const __m256d move = _mm256_set1_pd(64), fine4 = _mm256_set1_pd(fine);
  __m128 lattice[2];
  for (int h = 0; h < 2; ++h) {
    const __m128i s_half = h ? _mm256_extracti128_si256(s, 1) : _mm256_castsi256_si128(s);
    const __m128i q_half = h ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
    const __m256d base = _mm256_add_pd(kp[h], _mm256_cvtepi32_pd(s_half));
    lattice[h] = _mm256_cvtpd_ps(
        _mm256_mul_pd(_mm256_add_pd(base, _mm256_mul_pd(move, _mm256_cvtepi32_pd(q_half))), fine4));
  }
  const __m256i bits =
      _mm256_castps_si256(_mm256_insertf128_ps(_mm256_castps128_ps256(lattice[0]), lattice[1], 1));
  const __m256i next = NextHistoryEight(LatticeStateEight(ref_bits), q);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), WithHistoryEight(bits, next));
  return true;
}
#endif

}  // namespace ckpt::lossy
