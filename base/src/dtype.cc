#include "ckpt/base/dtype.h"

#include <array>
#include <utility>

namespace ckpt {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  uint32_t size;
  bool is_float;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {DType::kF64, "F64", 8, true},
    {DType::kF32, "F32", 4, true},
    {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},
    {DType::kI64, "I64", 8, false},
    {DType::kI32, "I32", 4, false},
    {DType::kI16, "I16", 2, false},
    {DType::kI8, "I8", 1, false},
    {DType::kU64, "U64", 8, false},
    {DType::kU32, "U32", 4, false},
    {DType::kU16, "U16", 2, false},
    {DType::kU8, "U8", 1, false},
    {DType::kBool, "BOOL", 1, false},
    {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true},
}};

const DTypeEntry& Entry(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable for valid enum values
}

}  // namespace

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

std::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

std::optional<DType> DTypeFromTag(uint8_t tag) {
  for (const auto& e : kDTypes) {
    if (static_cast<uint8_t>(e.dtype) == tag) return e.dtype;
  }
  return std::nullopt;
}

uint32_t DTypeSize(DType dtype) { return Entry(dtype).size; }

bool DTypeIsFloat(DType dtype) { return Entry(dtype).is_float; }

}  // namespace ckpt
