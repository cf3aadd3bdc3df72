// Byte-plane transposition (byte_planes.h). Floats of 2 and 4 bytes, the dtypes of nearly every
// checkpoint tensor, take SSE2 paths (16 elements per step; SSE2 is part of x86-64); the rest, and
// the tail of every run, the scalar loop.
#include "byte_planes.h"

#include <cstddef>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckpt {
namespace {

enum class Transpose { kSplit, kMerge };

// Elements [begin, n) of P bytes, one byte at a time.
template <Transpose kDirection, uint32_t P>
void TransposeScalar(const uint8_t* in, const uint8_t* ref, size_t begin, size_t n, uint8_t* out) {
  for (size_t i = begin; i < n; ++i) {
    for (uint32_t p = 0; p < P; ++p) {
      const size_t element_index = i * P + p;
      const size_t plane_index = p * n + i;
      const size_t from = kDirection == Transpose::kSplit ? element_index : plane_index;
      const size_t to = kDirection == Transpose::kSplit ? plane_index : element_index;
      uint8_t b = in[from];
      if (ref) b ^= ref[element_index];
      out[to] = b;
    }
  }
}

#if defined(__SSE2__)
__m128i Load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
void Store(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
// The k-th 16 bytes at `p` (element layout), XORed with those of `ref` if any.
__m128i LoadXor(const uint8_t* p, const uint8_t* ref, size_t k) {
  const __m128i v = Load(p + 16 * k);
  return ref ? _mm_xor_si128(v, Load(ref + 16 * k)) : v;
}
// The even and the odd bytes of a and b (16-bit lanes): a's first, then b's.
__m128i EvenBytes(__m128i a, __m128i b) {
  const __m128i low = _mm_set1_epi16(0x00ff);
  return _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low));
}
__m128i OddBytes(__m128i a, __m128i b) {
  return _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
}

// Returns the number of elements done (a multiple of 16).
template <uint32_t P>
size_t SplitSimd(const uint8_t* in, const uint8_t* ref, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint8_t* s = in + P * i;
    const uint8_t* r = ref ? ref + P * i : nullptr;
    if constexpr (P == 2) {
      const __m128i x0 = LoadXor(s, r, 0), x1 = LoadXor(s, r, 1);
      Store(out + i, EvenBytes(x0, x1));
      Store(out + n + i, OddBytes(x0, x1));
    } else {
      const __m128i x0 = LoadXor(s, r, 0), x1 = LoadXor(s, r, 1);
      const __m128i x2 = LoadXor(s, r, 2), x3 = LoadXor(s, r, 3);
      // Bytes 0 and 2, then 1 and 3, of each element; then each pair split.
      const __m128i even_lo = EvenBytes(x0, x1), even_hi = EvenBytes(x2, x3);
      const __m128i odd_lo = OddBytes(x0, x1), odd_hi = OddBytes(x2, x3);
      Store(out + i, EvenBytes(even_lo, even_hi));
      Store(out + n + i, EvenBytes(odd_lo, odd_hi));
      Store(out + 2 * n + i, OddBytes(even_lo, even_hi));
      Store(out + 3 * n + i, OddBytes(odd_lo, odd_hi));
    }
  }
  return i;
}

template <uint32_t P>
size_t MergeSimd(const uint8_t* in, const uint8_t* ref, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint8_t* o = out + P * i;
    const uint8_t* r = ref ? ref + P * i : nullptr;
    auto put = [&](size_t k, __m128i v) {
      Store(o + 16 * k, r ? _mm_xor_si128(v, Load(r + 16 * k)) : v);
    };
    const __m128i a = Load(in + i), b = Load(in + n + i);
    if constexpr (P == 2) {
      put(0, _mm_unpacklo_epi8(a, b));
      put(1, _mm_unpackhi_epi8(a, b));
    } else {
      const __m128i c = Load(in + 2 * n + i), d = Load(in + 3 * n + i);
      const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
      const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
      put(0, _mm_unpacklo_epi16(ab_lo, cd_lo));
      put(1, _mm_unpackhi_epi16(ab_lo, cd_lo));
      put(2, _mm_unpacklo_epi16(ab_hi, cd_hi));
      put(3, _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
  }
  return i;
}
#endif

template <Transpose kDirection, uint32_t P>
void TransposeFixed(const uint8_t* in, const uint8_t* ref, size_t n, uint8_t* out) {
  size_t done = 0;
#if defined(__SSE2__)
  if constexpr (P == 2 || P == 4) {
    done = kDirection == Transpose::kSplit ? SplitSimd<P>(in, ref, n, out)
                                           : MergeSimd<P>(in, ref, n, out);
  }
#endif
  TransposeScalar<kDirection, P>(in, ref, done, n, out);
}

template <Transpose kDirection>
void TransposePlanes(std::span<const uint8_t> in, const uint8_t* ref, uint32_t planes,
                     uint8_t* out) {
  const size_t n = in.size() / planes;
  switch (planes) {
    case 2:
      return TransposeFixed<kDirection, 2>(in.data(), ref, n, out);
    case 4:
      return TransposeFixed<kDirection, 4>(in.data(), ref, n, out);
    case 8:
      return TransposeFixed<kDirection, 8>(in.data(), ref, n, out);
    default:
      for (size_t i = 0; i < in.size(); ++i) out[i] = in[i] ^ (ref ? ref[i] : 0);
  }
}

}  // namespace

void SplitPlanes(std::span<const uint8_t> in, const uint8_t* ref, uint32_t planes, uint8_t* out) {
  TransposePlanes<Transpose::kSplit>(in, ref, planes, out);
}

void MergePlanes(std::span<const uint8_t> in, const uint8_t* ref, uint32_t planes, uint8_t* out) {
  TransposePlanes<Transpose::kMerge>(in, ref, planes, out);
}

}  // namespace ckpt
