// Element access of the lossy codec: every float dtype loaded to double and stored from double
// with one rounding, bit-identically on every build (internal to codec/).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include "ckpt/base/dtype.h"

namespace ckpt::lossy {

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

// The float dtypes the lossy codec quantizes, listed once: X(D) for each (explicit
// instantiations, VisitFloatDType).
#define CKPT_LOSSY_DTYPES(X) X(DType::kF64) X(DType::kF32) X(DType::kF16) X(DType::kBF16)

// fn.template operator()<D>() for `dtype` when it is one of CKPT_LOSSY_DTYPES; nullopt for the
// others (the caller says why they are not quantized).
template <typename Fn>
auto VisitFloatDType(DType dtype, Fn&& fn)
    -> std::optional<decltype(fn.template operator()<DType::kF32>())> {
#define CKPT_VISIT_CASE(D) \
  case D:                  \
    return fn.template operator()<D>();
  switch (dtype) {
    CKPT_LOSSY_DTYPES(CKPT_VISIT_CASE)
    default:
      return std::nullopt;
  }
#undef CKPT_VISIT_CASE
}

}  // namespace ckpt::lossy
