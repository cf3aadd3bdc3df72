// Element types of safetensors tensors.
//
// The numeric values of DType are persisted in version manifests: written to disk, never
// change them, never reuse a retired number.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ckpt {

enum class DType : uint8_t {
  kF64 = 1,
  kF32 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI64 = 5,
  kI32 = 6,
  kI16 = 7,
  kI8 = 8,
  kU64 = 9,
  kU32 = 10,
  kU16 = 11,
  kU8 = 12,
  kBool = 13,
  kF8E4M3 = 14,
  kF8E5M2 = 15,
};

// Parses the safetensors spelling ("F32", "BF16", "F8_E4M3", ...); nullopt if unknown.
std::optional<DType> DTypeFromName(std::string_view name);
// The safetensors spelling of `dtype`.
std::string_view DTypeName(DType dtype);
// Parses a persisted tag; nullopt if the tag is not a known DType.
std::optional<DType> DTypeFromTag(uint8_t tag);
// Bytes per element (1 for BOOL and the 8-bit floats).
uint32_t DTypeSize(DType dtype);
// True for the IEEE-like floating-point types (F64, F32, F16, BF16, F8_*).
bool DTypeIsFloat(DType dtype);

}  // namespace ckpt
