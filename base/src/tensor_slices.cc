#include "ckpt/base/tensor_slices.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ckpt {
namespace {

using nlohmann::json;

Status Invalid(std::string_view tensor, const std::string& what) {
  return Status::InvalidArgument("slices of tensor '" + std::string(tensor) + "': " + what);
}

// The dimensions of a JSON array of non-negative integers.
Result<std::vector<uint64_t>> ReadDims(std::string_view tensor, const json& entry,
                                       const char* field) {
  auto it = entry.find(field);
  if (it == entry.end() || !it->is_array()) {
    return Invalid(tensor, std::string("missing array field '") + field + "'");
  }
  std::vector<uint64_t> dims;
  for (const json& d : *it) {
    if (!d.is_number_unsigned()) {
      return Invalid(tensor, std::string("'") + field + "' must hold non-negative integers");
    }
    dims.push_back(d.get<uint64_t>());
  }
  return dims;
}

std::string DimsText(std::span<const uint64_t> dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

}  // namespace

uint64_t TensorBox::element_count() const {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return UINT64_MAX;
  }
  return n;
}

BoxRuns::BoxRuns(std::span<const uint64_t> global_shape, TensorBox box)
    : stride_(global_shape.size(), 1), box_(std::move(box)) {
  const size_t rank = global_shape.size();
  done_ = box_.element_count() == 0;
  if (rank == 0) {
    run_ = 1;
    return;
  }
  for (size_t d = rank - 1; d > 0; --d) stride_[d - 1] = stride_[d] * global_shape[d];
  // Trailing dimensions the box covers whole are contiguous with the one before them: a run is
  // the box's extent in dimension split_ times the global extent of every dimension after it.
  split_ = rank - 1;
  while (split_ > 0 && box_.shape[split_] == global_shape[split_]) --split_;
  run_ = box_.shape[split_] * stride_[split_];
  outer_.assign(split_, 0);
}

bool BoxRuns::Next(uint64_t* global_element, uint64_t* count) {
  if (done_) return false;
  if (stride_.empty()) {
    done_ = true;
    *global_element = 0;
    *count = 1;
    return true;
  }
  uint64_t start = box_.offsets[split_] * stride_[split_];
  for (size_t d = 0; d < split_; ++d) start += (box_.offsets[d] + outer_[d]) * stride_[d];
  *global_element = start;
  *count = run_;
  size_t d = split_;
  while (d > 0 && ++outer_[d - 1] == box_.shape[d - 1]) outer_[--d] = 0;
  done_ = d == 0;
  return true;
}

Result<std::map<std::string, SliceDeclaration>> ParseSliceDeclarations(
    const std::map<std::string, std::string>& metadata) {
  std::map<std::string, SliceDeclaration> slices;
  auto it = metadata.find(std::string(kSlicesMetadataKey));
  if (it == metadata.end()) return slices;
  const json doc = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) {
    return Status::InvalidArgument("metadata '" + std::string(kSlicesMetadataKey) +
                                   "' must be a JSON object of tensor name -> "
                                   "{\"global_shape\", \"offsets\"}");
  }
  for (const auto& [name, entry] : doc.items()) {
    if (!entry.is_object()) return Invalid(name, "entry must be a JSON object");
    SliceDeclaration slice;
    CKPT_ASSIGN_OR_RETURN(slice.global_shape, ReadDims(name, entry, "global_shape"));
    CKPT_ASSIGN_OR_RETURN(slice.offsets, ReadDims(name, entry, "offsets"));
    slices.emplace(name, std::move(slice));
  }
  return slices;
}

std::string SliceDeclarationsJson(const std::map<std::string, SliceDeclaration>& slices) {
  json doc = json::object();
  for (const auto& [name, slice] : slices) {
    doc[name] = {{"global_shape", slice.global_shape}, {"offsets", slice.offsets}};
  }
  return doc.dump();
}

Status CheckBoxWithin(std::string_view tensor, const TensorBox& box,
                      std::span<const uint64_t> global_shape) {
  if (box.offsets.size() != global_shape.size() || box.shape.size() != global_shape.size()) {
    return Invalid(tensor, "a slice of shape " + DimsText(box.shape) + " at offsets " +
                               DimsText(box.offsets) + " does not have the rank of the global " +
                               "shape " + DimsText(global_shape));
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    uint64_t end = 0;
    if (__builtin_add_overflow(box.offsets[d], box.shape[d], &end) || end > global_shape[d]) {
      return Invalid(tensor, "a slice of shape " + DimsText(box.shape) + " at offsets " +
                                 DimsText(box.offsets) + " reaches past the global shape " +
                                 DimsText(global_shape) + " in dimension " + std::to_string(d));
    }
  }
  return Status::Ok();
}

bool BoxesOverlap(const TensorBox& a, const TensorBox& b) {
  if (a.element_count() == 0 || b.element_count() == 0) return false;
  for (size_t d = 0; d < a.shape.size() && d < b.shape.size(); ++d) {
    const uint64_t a_end = a.offsets[d] + a.shape[d];
    const uint64_t b_end = b.offsets[d] + b.shape[d];
    if (a_end <= b.offsets[d] || b_end <= a.offsets[d]) return false;
  }
  return true;
}

Status CheckTiling(std::string_view tensor, std::span<const uint64_t> global_shape,
                   std::span<const TensorBox> boxes,
                   const std::function<std::string(size_t)>& box_name) {
  uint64_t total = 1;
  for (uint64_t d : global_shape) {
    if (__builtin_mul_overflow(total, d, &total)) {
      return Invalid(tensor, "global shape " + DimsText(global_shape) + " is too large");
    }
  }
  uint64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (BoxesOverlap(boxes[i], boxes[j])) {
        return Invalid(tensor, box_name(j) + " and " + box_name(i) + " overlap");
      }
    }
    covered += boxes[i].element_count();
  }
  if (covered != total) {
    return Invalid(tensor, "the slices cover " + std::to_string(covered) + " of the " +
                               std::to_string(total) + " elements of global shape " +
                               DimsText(global_shape) + " (a gap)");
  }
  return Status::Ok();
}

std::pair<uint64_t, uint64_t> BoxElementSpan(std::span<const uint64_t> global_shape,
                                             const TensorBox& box) {
  if (box.element_count() == 0) return {0, 0};
  uint64_t first = 0, last = 0, stride = 1;
  for (size_t d = global_shape.size(); d-- > 0;) {
    first += box.offsets[d] * stride;
    last += (box.offsets[d] + box.shape[d] - 1) * stride;
    stride *= global_shape[d];
  }
  return {first, last + 1};
}

std::pair<uint64_t, uint64_t> SplitExtent(uint64_t extent, uint32_t rank, uint32_t ranks) {
  const uint64_t base = extent / ranks;
  const uint64_t longer = extent % ranks;
  const uint64_t offset = rank * base + std::min<uint64_t>(rank, longer);
  return {offset, base + (rank < longer ? 1 : 0)};
}

}  // namespace ckpt
