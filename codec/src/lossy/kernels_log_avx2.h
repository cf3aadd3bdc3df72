// AVX2 kernel of the log quantizer's ratio mode (Adam's exp_avg_sq deltas): four F32 elements at
// a time, giving exactly the symbols and reconstructions of the per-element loop in
// quantize_additive.cc. Compiled for every x86-64 build and used only where the CPU has AVX2
// (CpuHasAvx2 in kernels_avx2.h).
//
// The per-element loop takes each element's index from glibc's log2. The kernel computes log2
// with its own series, accurate to far below the margin it keeps from every rounding boundary:
// an index within the margin of a tie, like every other unusual element, sends its group of four
// to the per-element loop, so the indices, and so the payload, are the same on every CPU.
#pragma once

#include "lossy/kernels_avx2.h"

#ifdef CKPT_LOSSY_AVX2
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "lossy/quantizers.h"

namespace ckpt::lossy {

// What the kernel needs of a chunk's ratio-mode quantizer, prepared once per chunk.
struct RatioKernelConstants {
  static constexpr int kMaxMove = 7;  // |q| <= 7: a direct symbol with a flip and an offset
  double inverse_step = 0;
  double offset = 0;
  double eps = 0;
  // Rounding boundaries closer than this to t send the group to the per-element loop: a hundred
  // times the series' error (below 1e-12 in log2) scaled to index units, plus the error of
  // glibc's log2 and of the products.
  double margin = 0;
  uint32_t symbol_offset = 0;  // 1 with a lattice offset (symbol 0 stays "unchanged")
  bool non_negative = false;
  double powers[2 * kMaxMove + 1] = {};  // LogQuantizer::Power(q) for q = -7 .. 7

  RatioKernelConstants(const LogQuantizer& log, double eps_in, bool non_negative_in)
      : inverse_step(log.inverse_step),
        offset(log.offset),
        eps(eps_in),
        margin(1e-9 + 1e-10 * log.inverse_step),
        symbol_offset(log.offset != 0 ? 1 : 0),
        non_negative(non_negative_in) {
    for (int q = -kMaxMove; q <= kMaxMove; ++q) powers[q + kMaxMove] = log.Power(q);
  }
};

// log2(a) for four positive normal doubles, within 1e-12: a = 2^e m with m in [sqrt(1/2),
// sqrt(2)), ln m = 2 atanh(s) with s = (m - 1) / (m + 1), |s| < 0.172, summed to s^13.
__attribute__((target("avx2"), always_inline)) inline __m256d Log2Four(__m256d a) {
  const __m256i bits = _mm256_castpd_si256(a);
  const __m256i exponent_bits = _mm256_srli_epi64(bits, 52);
  // An integer below 2^52 as a double: its bits under those of 2^52, minus 2^52.
  __m256d e = _mm256_sub_pd(
      _mm256_castsi256_pd(_mm256_or_si256(exponent_bits, _mm256_set1_epi64x(0x4330000000000000))),
      _mm256_set1_pd(0x1p52 + 1023));
  __m256d m = _mm256_castsi256_pd(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFF)),
                      _mm256_set1_epi64x(0x3FF0000000000000)));
  const __m256d big = _mm256_cmp_pd(m, _mm256_set1_pd(M_SQRT2), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), big);
  e = _mm256_add_pd(e, _mm256_and_pd(big, _mm256_set1_pd(1.0)));
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d s = _mm256_div_pd(_mm256_sub_pd(m, one), _mm256_add_pd(m, one));
  const __m256d s2 = _mm256_mul_pd(s, s);
  __m256d sum = _mm256_set1_pd(2.0 / 13);
  for (const double c : {2.0 / 11, 2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3, 2.0}) {
    sum = _mm256_add_pd(_mm256_mul_pd(sum, s2), _mm256_set1_pd(c));
  }
  const __m256d ln_m = _mm256_mul_pd(sum, s);
  return _mm256_add_pd(e, _mm256_mul_pd(ln_m, _mm256_set1_pd(M_LOG2E)));
}

// The ratio-mode loop's usual case for the four F32 elements at `in` against `ref`: symbols into
// symbols[0 .. 4) and reconstructions into recon. Returns false, having written nothing, unless
// every lane is usual: x and p finite, non-zero and different, a normal ratio whose index is
// within kMaxMove and clear of the margin, a reconstruction strictly inside the pointwise bound
// (and not negative in a non-negative chunk).
__attribute__((target("avx2"))) inline bool QuantizeRatioFourF32(const uint8_t* in,
                                                                 const uint8_t* ref,
                                                                 const RatioKernelConstants& k,
                                                                 uint8_t* recon, uint8_t* symbols) {
  const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(in)));
  const __m256d p = _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(ref)));
  const __m256d zero = _mm256_setzero_pd();
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFF));
  const __m256d infinity = _mm256_set1_pd(HUGE_VAL);
  const __m256d a = _mm256_div_pd(x, p);
  const __m256d abs_a = _mm256_and_pd(a, abs_mask);
  __m256d usual =
      _mm256_and_pd(_mm256_cmp_pd(x, p, _CMP_NEQ_OQ), _mm256_cmp_pd(x, zero, _CMP_NEQ_OQ));
  usual = _mm256_and_pd(usual, _mm256_cmp_pd(_mm256_and_pd(p, abs_mask), infinity, _CMP_LT_OQ));
  usual = _mm256_and_pd(usual, _mm256_cmp_pd(p, zero, _CMP_NEQ_OQ));
  usual = _mm256_and_pd(usual, _mm256_cmp_pd(abs_a, _mm256_set1_pd(0x1p-1022), _CMP_GE_OQ));
  usual = _mm256_and_pd(usual, _mm256_cmp_pd(abs_a, infinity, _CMP_LT_OQ));
  if (_mm256_movemask_pd(usual) != 0xf) return false;

  const __m256d t = _mm256_sub_pd(_mm256_mul_pd(Log2Four(abs_a), _mm256_set1_pd(k.inverse_step)),
                                  _mm256_set1_pd(k.offset));
  const __m256d margin = _mm256_set1_pd(k.margin);
  const __m256d q = RoundToIntegerFour(_mm256_add_pd(t, margin));
  __m256d fine = _mm256_cmp_pd(q, RoundToIntegerFour(_mm256_sub_pd(t, margin)), _CMP_EQ_OQ);
  fine = _mm256_and_pd(fine,
                       _mm256_cmp_pd(_mm256_and_pd(q, abs_mask),
                                     _mm256_set1_pd(RatioKernelConstants::kMaxMove), _CMP_LE_OQ));
  if (_mm256_movemask_pd(fine) != 0xf) return false;

  const __m128i q32 = _mm256_cvtpd_epi32(q);
  // The masked form: the plain one leaves its pass-through register undefined, which GCC warns of.
  const __m256d power = _mm256_mask_i32gather_pd(
      zero, k.powers, _mm_add_epi32(q32, _mm_set1_epi32(RatioKernelConstants::kMaxMove)),
      _mm256_castsi256_pd(_mm256_set1_epi64x(-1)), 8);
  // p * Power(q), negated where the ratio is negative (its sign bit: a is never a zero here).
  const __m256d sign_mask = _mm256_set1_pd(-0.0);
  const __m256d restored = _mm256_xor_pd(_mm256_mul_pd(p, power), _mm256_and_pd(a, sign_mask));
  const __m128 r_float = _mm256_cvtpd_ps(restored);
  const __m256d r = _mm256_cvtps_pd(r_float);
  // PointwiseBound(eps, x) (eps |x| > 2^-1000 for every finite non-zero F32 and eps >= 2^-800).
  const __m256d product = _mm256_mul_pd(_mm256_set1_pd(k.eps), _mm256_and_pd(x, abs_mask));
  __m256d accepted = _mm256_cmp_pd(product, _mm256_set1_pd(0x1p-1000), _CMP_GT_OQ);
  const __m256d bound = _mm256_mul_pd(product, _mm256_set1_pd(1 - 0x1p-51));
  accepted = _mm256_and_pd(
      accepted, _mm256_cmp_pd(_mm256_and_pd(_mm256_sub_pd(x, r), abs_mask), bound, _CMP_LT_OQ));
  if (k.non_negative) accepted = _mm256_andnot_pd(r, accepted);  // sign bit of r clear
  if (_mm256_movemask_pd(accepted) != 0xf) return false;

  // z = 2 zigzag(q) + flip + symbol_offset, with zigzag(q) = 2q (q >= 0) or -2q - 1.
  const __m128i negative = _mm_cmplt_epi32(q32, _mm_setzero_si128());
  const __m128i zigzag = _mm_xor_si128(_mm_slli_epi32(q32, 1), negative);
  const __m128i flip =
      _mm_srli_epi32(_mm_castps_si128(_mm256_cvtpd_ps(_mm256_and_pd(a, sign_mask))), 31);
  const __m128i z = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(zigzag, 1), flip),
                                  _mm_set1_epi32(static_cast<int>(k.symbol_offset)));
  _mm_storeu_ps(reinterpret_cast<float*>(recon), r_float);
  const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(z, z), _mm_setzero_si128());
  const uint32_t packed = static_cast<uint32_t>(_mm_cvtsi128_si32(bytes));
  __builtin_memcpy(symbols, &packed, 4);
  return true;
}

}  // namespace ckpt::lossy

#endif  // CKPT_LOSSY_AVX2
