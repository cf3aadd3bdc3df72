// SSE2 kernels of the lossy codec: four F32 elements at a time. Each computes exactly what its
// portable twin (named in its comment; the element loops in quantize_*.cc and decoder.cc)
// computes for each of the four, and reports when a group needs that twin instead (a large or
// verbatim symbol, an element outside the fast path's conditions). docs/format.md specifies the
// arithmetic.
#pragma once

#if defined(__SSE2__)
#include <emmintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "lossy/history.h"
#include "lossy/symbols.h"

namespace ckpt::lossy {

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

// Four F32 elements of a lattice delta, all with direct symbols (`four`, one per byte), exactly
// as the general loop decodes them: kp = RoundToInteger(p * inverse_step) + 0.0, one rounding
// of (kp + q) * step to float, and with kHistory the next history state written into it
// (NextHistory of the reference's state and q). Returns false, having written nothing, when a
// reference has no lattice index (then the general loop decodes the four). (Keyframes decode by
// table: ElementDecoder::DecodeKeyframe.)
template <bool kHistory = false>
inline bool DecodeFourLatticeF32(uint32_t four, double step, double inverse_step,
                                 const uint8_t* ref, uint8_t* out) {
  const __m128 p = _mm_loadu_ps(reinterpret_cast<const float*>(ref));
  __m128d kp_lo, kp_hi;
  if (!LatticeIndicesFour(p, inverse_step, &kp_lo, &kp_hi)) return false;
  const __m128i q = UnzigzagFour(four);
  const __m128d step2 = _mm_set1_pd(step);
  const __m128d q_lo = _mm_cvtepi32_pd(q), q_hi = _mm_cvtepi32_pd(_mm_shuffle_epi32(q, 0xee));
  const __m128d r_lo = _mm_mul_pd(_mm_add_pd(kp_lo, q_lo), step2);
  const __m128d r_hi = _mm_mul_pd(_mm_add_pd(kp_hi, q_hi), step2);
  __m128i bits = _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(r_lo), _mm_cvtpd_ps(r_hi)));
  if constexpr (kHistory) {
    const __m128i next = NextHistoryFour(
        LatticeStateFour(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ref))), q_lo, q_hi);
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

// The smallest and largest finite F32 element of in[0 .. n), eight at a time, into *low and
// *high (which the caller starts at +inf and -inf); returns how many elements it covered (the
// caller's scalar loop, FiniteRange in plan.cc, does the rest).
inline size_t FiniteRangeF32(const uint8_t* in, size_t n, float* low, float* high) {
  // Two pairs of accumulators (GCC keeps the scalar loop scalar: min and max of floats are not
  // associative for it).
  const float kInf = std::numeric_limits<float>::infinity();
  const __m128 zero = _mm_setzero_ps(), inf = _mm_set1_ps(kInf), minus_inf = _mm_set1_ps(-kInf);
  __m128 low0 = inf, low1 = inf, high0 = minus_inf, high1 = minus_inf;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(reinterpret_cast<const float*>(in + i * 4));
    const __m128 b = _mm_loadu_ps(reinterpret_cast<const float*>(in + i * 4 + 16));
    const __m128 finite_a = _mm_cmpeq_ps(_mm_sub_ps(a, a), zero);
    const __m128 finite_b = _mm_cmpeq_ps(_mm_sub_ps(b, b), zero);
    const __m128 kept_a = _mm_and_ps(finite_a, a), kept_b = _mm_and_ps(finite_b, b);
    low0 = _mm_min_ps(low0, _mm_or_ps(kept_a, _mm_andnot_ps(finite_a, inf)));
    low1 = _mm_min_ps(low1, _mm_or_ps(kept_b, _mm_andnot_ps(finite_b, inf)));
    high0 = _mm_max_ps(high0, _mm_or_ps(kept_a, _mm_andnot_ps(finite_a, minus_inf)));
    high1 = _mm_max_ps(high1, _mm_or_ps(kept_b, _mm_andnot_ps(finite_b, minus_inf)));
  }
  alignas(16) float lows[4], highs[4];
  _mm_store_ps(lows, _mm_min_ps(low0, low1));
  _mm_store_ps(highs, _mm_max_ps(high0, high1));
  for (int k = 0; k < 4; ++k) {
    *low = std::min(*low, lows[k]);
    *high = std::max(*high, highs[k]);
  }
  return i;
}

// The low-rank fit's input for F32 elements, four at a time: (x - p) * inverse_step, 0 where
// that is not finite, clamped to ±max_steps (DeltaInSteps in plan.cc). Returns how many
// elements it covered.
inline size_t DeltaInStepsF32(const uint8_t* in, const uint8_t* ref, size_t n, double inverse_step,
                              double max_steps, float* out) {
  const __m128d inverse = _mm_set1_pd(inverse_step), high = _mm_set1_pd(max_steps),
                low = _mm_set1_pd(-max_steps);
  const __m128d magnitude = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffff));
  const __m128d infinity = _mm_set1_pd(std::numeric_limits<double>::infinity());
  auto steps = [&](__m128d x, __m128d p) {
    const __m128d d = _mm_mul_pd(_mm_sub_pd(x, p), inverse);
    const __m128d finite = _mm_cmplt_pd(_mm_and_pd(d, magnitude), infinity);  // not NaN, ±Inf
    return _mm_cvtpd_ps(_mm_and_pd(finite, _mm_min_pd(_mm_max_pd(d, low), high)));
  };
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 x = _mm_loadu_ps(reinterpret_cast<const float*>(in) + i);
    const __m128 p = _mm_loadu_ps(reinterpret_cast<const float*>(ref) + i);
    const __m128 d_low = steps(_mm_cvtps_pd(x), _mm_cvtps_pd(p));
    const __m128 d_high =
        steps(_mm_cvtps_pd(_mm_movehl_ps(x, x)), _mm_cvtps_pd(_mm_movehl_ps(p, p)));
    _mm_storeu_ps(out + i, _mm_movelh_ps(d_low, d_high));
  }
  return i;
}

}  // namespace ckpt::lossy
#endif  // __SSE2__
