// AVX2 kernels of the lossy codec's lattices (plain and low-rank): eight F32 elements at a time,
// four double lanes per register, with exactly the arithmetic of the SSE2 kernels (kernels_sse2.h)
// and so of their portable twins. Compiled for every x86-64 build and used only where the CPU has
// AVX2 (CpuHasAvx2).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define CKPT_LOSSY_AVX2 1
#include <immintrin.h>

#include <cstdint>

#include "lossy/history.h"
#include "lossy/kernel_choice.h"
#include "lossy/low_rank.h"
#include "lossy/symbols.h"

namespace ckpt::lossy {

// Whether the AVX2 kernels run: the CPU has AVX2 and the call did not choose the portable
// kernels (kernel_choice.h).
inline bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !PortableKernelsChosen();
}

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
// LatticeIndex of eight F32 lanes into kp[0] (lanes 0-3) and kp[1] (lanes 4-7); false, with
// kp unspecified, when one has no index.
__attribute__((target("avx2"), always_inline)) inline bool LatticeIndicesEight(__m256 p,
                                                                               double inverse,
                                                                               __m256d kp[2]) {
  const __m256d inv = _mm256_set1_pd(inverse), max_index = _mm256_set1_pd(0x1p50);
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
  for (int h = 0; h < 2; ++h) {
    const __m256d pt = _mm256_mul_pd(
        _mm256_cvtps_pd(h ? _mm256_extractf128_ps(p, 1) : _mm256_castps256_ps128(p)), inv);
    const __m256d indexed = _mm256_cmp_pd(_mm256_and_pd(pt, abs_mask), max_index, _CMP_LE_OQ);
    if (_mm256_movemask_pd(indexed) != 0xf) return false;
    kp[h] = RoundToIntegerFour(pt);
  }
  return true;
}

// The eight direct symbols of `eight` (one per byte) as 32-bit lanes q = unzigzag(z).
__attribute__((target("avx2"), always_inline)) inline __m256i UnzigzagEight(uint64_t eight) {
  const __m256i z = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(eight)));
  return _mm256_xor_si256(
      _mm256_srli_epi32(z, 1),
      _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(z, _mm256_set1_epi32(1))));
}

// DecodeFourLowRankF32 for eight elements, all with direct symbols (`eight`, one per byte):
// (kp + shift + 64 q) * fine rounded once to float, with the next history state. Returns false,
// having written nothing, when a reference has no index.
__attribute__((target("avx2"), always_inline)) inline bool DecodeEightLowRankF32(
    uint64_t eight, double fine, double inverse_fine, const int32_t* shift, const uint8_t* ref,
    uint8_t* out) {
  const __m256i ref_bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ref));
  const __m256 p = _mm256_castsi256_ps(ref_bits);
  __m256d kp[2];
  if (!LatticeIndicesEight(p, inverse_fine, kp)) return false;
  const __m256i q = UnzigzagEight(eight);
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

// DecodeFourLatticeF32 for eight elements, all with direct symbols (`eight`, one per byte):
// (kp + q) * step rounded once to float, with the next history state when kHistory. Returns
// false, having written nothing, when a reference has no index.
template <bool kHistory>
__attribute__((target("avx2"), always_inline)) inline bool DecodeEightLatticeF32(
    uint64_t eight, double step, double inverse_step, const uint8_t* ref, uint8_t* out) {
  const __m256i ref_bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ref));
  const __m256 p = _mm256_castsi256_ps(ref_bits);
  __m256d kp[2];
  if (!LatticeIndicesEight(p, inverse_step, kp)) return false;
  const __m256i q = UnzigzagEight(eight);
  const __m256d step4 = _mm256_set1_pd(step);
  __m128 lattice[2];
  for (int h = 0; h < 2; ++h) {
    const __m128i q_half = h ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
    lattice[h] =
        _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_add_pd(kp[h], _mm256_cvtepi32_pd(q_half)), step4));
  }
  __m256i bits =
      _mm256_castps_si256(_mm256_insertf128_ps(_mm256_castps128_ps256(lattice[0]), lattice[1], 1));
  if constexpr (kHistory) {
    bits = WithHistoryEight(bits, NextHistoryEight(LatticeStateEight(ref_bits), q));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bits);
  return true;
}

}  // namespace ckpt::lossy
#endif  // __x86_64__ && __GNUC__
