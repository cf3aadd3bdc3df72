// Values as doubles -> bytes of a float dtype, rounded to nearest as a client would store them.
// Uses the compiler's _Float16 (the codec suites build with GCC; clang 14 lacks it on x86-64).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ckpt/codec/dtype.h"

namespace ckpt::testing {

inline std::vector<uint8_t> PackFloats(DType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = out.data() + i * DTypeSize(dtype);
    const double v = values[i];
    switch (dtype) {
      case DType::kF64:
        std::memcpy(p, &v, 8);
        break;
      case DType::kF32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kF16: {
        const _Float16 h = static_cast<_Float16>(v);
        std::memcpy(p, &h, 2);
        break;
      }
      default: {  // BF16: round to nearest even from F32's bits; NaN keeps its top bits
        const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
        const uint16_t b = std::isnan(v)
                               ? static_cast<uint16_t>(bits >> 16)
                               : static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
        std::memcpy(p, &b, 2);
        break;
      }
    }
  }
  return out;
}

}  // namespace ckpt::testing
