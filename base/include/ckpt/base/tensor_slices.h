// Slices of global tensors: how a shard of a sharded version declares that a tensor it holds is
// a box of a larger (global) tensor, and the box arithmetic that assembles boxes into global
// tensors and cuts global tensors into boxes (docs/api.md, "Sharded versions").
//
// A shard's safetensors `__metadata__` may carry, under kSlicesMetadataKey, a JSON object (as a
// string, as safetensors metadata values are) naming its sliced tensors:
//   {"layers.0.qkv.weight": {"global_shape": [768, 256], "offsets": [192, 0]}, ...}
// The tensor's own shape in the shard is the slice's extent. Tensors not named are whole.
//
// Pure computation: no I/O, no state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

// The metadata key of a shard's slice declarations; also set on the tensors of a resharded
// restore, so that what a rank receives says where it belongs.
inline constexpr std::string_view kSlicesMetadataKey = "ckptd.slices";

// Where a shard's tensor lies in its global tensor.
struct SliceDeclaration {
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> offsets;  // of the slice's first element, per dimension
};

// A box of a tensor: its first element and its extent per dimension (a rank-0 box is the one
// element of a scalar).
struct TensorBox {
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> shape;

  uint64_t element_count() const;
  bool operator==(const TensorBox&) const = default;
};

// The box of the whole of a tensor of `shape`.
inline TensorBox WholeBox(std::span<const uint64_t> shape) {
  return {std::vector<uint64_t>(shape.size(), 0),
          std::vector<uint64_t>(shape.begin(), shape.end())};
}

// The slice declarations of a shard's metadata (an empty map when it has none). Malformed JSON
// or fields are InvalidArgument naming the tensor; ranges are checked by CheckBoxWithin.
Result<std::map<std::string, SliceDeclaration>> ParseSliceDeclarations(
    const std::map<std::string, std::string>& metadata);

// The metadata value declaring `slices` (the inverse of ParseSliceDeclarations).
std::string SliceDeclarationsJson(const std::map<std::string, SliceDeclaration>& slices);

// Checks that `box` has the rank of `global_shape` and lies within it. InvalidArgument names
// `tensor`.
Status CheckBoxWithin(std::string_view tensor, const TensorBox& box,
                      std::span<const uint64_t> global_shape);

// Whether two boxes of one tensor share an element (empty boxes share none).
bool BoxesOverlap(const TensorBox& a, const TensorBox& b);

// The runs of elements of a box that are consecutive both in the box's row-major order and in
// the global tensor's, in the box's order; together they cover the box exactly.
// Thread-compatible.
class BoxRuns {
 public:
  // REQUIRES: CheckBoxWithin(box, global_shape) is ok.
  BoxRuns(std::span<const uint64_t> global_shape, TensorBox box);
  // The next run: its first element's global index and its length. False after the last.
  bool Next(uint64_t* global_element, uint64_t* count);

 private:
  std::vector<uint64_t> stride_;  // of the global tensor, in elements
  TensorBox box_;
  size_t split_ = 0;             // the dimension runs advance in (those after it are whole)
  uint64_t run_ = 0;             // elements per run
  std::vector<uint64_t> outer_;  // index within the box of the dimensions before split_
  bool done_ = false;
};

// The elements a non-empty `box` spans in the global tensor's row-major order: its first
// element's index and one past its last (every element of the box lies between; a slice along
// dimension 0 is exactly that span). {0, 0} for an empty box. REQUIRES: CheckBoxWithin.
std::pair<uint64_t, uint64_t> BoxElementSpan(std::span<const uint64_t> global_shape,
                                             const TensorBox& box);

// Calls fn(box_index, count) over the global tensor in row-major order: its next `count`
// elements are the next `count` of box `box_index` (each box read in its own row-major order).
// Stops early when fn returns false. REQUIRES: `boxes` tile `global_shape` exactly
// (CheckTiling).
template <typename Fn>
void ForEachTileRun(std::span<const uint64_t> global_shape, std::span<const TensorBox> boxes,
                    Fn&& fn);

// Checks that `boxes` (each already CheckBoxWithin) cover every element of `global_shape`
// exactly once. InvalidArgument names `tensor` and, through `box_name`, the boxes at fault.
Status CheckTiling(std::string_view tensor, std::span<const uint64_t> global_shape,
                   std::span<const TensorBox> boxes,
                   const std::function<std::string(size_t)>& box_name);

// The part [offset, offset + length) of a dimension of extent `extent` that `rank` of `ranks`
// gets: consecutive parts, the first extent % ranks of them one element longer (numpy's
// array_split, torch's tensor_split).
std::pair<uint64_t, uint64_t> SplitExtent(uint64_t extent, uint32_t rank, uint32_t ranks);

// --- Implementation of the templates.

template <typename Fn>
void ForEachTileRun(std::span<const uint64_t> global_shape, std::span<const TensorBox> boxes,
                    Fn&& fn) {
  const size_t rank = global_shape.size();
  uint64_t total = 1;
  for (uint64_t d : global_shape) total *= d;
  if (total == 0) return;
  if (rank == 0) {
    for (size_t b = 0; b < boxes.size(); ++b) {
      if (boxes[b].element_count() == 1) {
        fn(b, uint64_t{1});
        return;
      }
    }
    return;
  }
  std::vector<uint64_t> index(rank, 0);  // of the next global element
  size_t current = 0;                    // the box the previous run came from: usually again
  auto contains = [&](const TensorBox& box) {
    for (size_t d = 0; d < rank; ++d) {
      if (index[d] < box.offsets[d] || index[d] >= box.offsets[d] + box.shape[d]) return false;
    }
    return true;
  };
  for (uint64_t element = 0; element < total;) {
    if (!contains(boxes[current])) {
      for (current = 0; current < boxes.size() && !contains(boxes[current]); ++current) {
      }
      if (current == boxes.size()) return;  // not a tiling: REQUIRES violated
    }
    const TensorBox& box = boxes[current];
    // The run continues along the last dimension to the box's end, and over whole dimensions
    // the box covers, from their start, into the dimension before.
    size_t d = rank - 1;
    uint64_t inner = 1;
    uint64_t run = box.offsets[d] + box.shape[d] - index[d];
    while (d > 0 && box.shape[d] == global_shape[d] && index[d] == 0) {
      inner *= global_shape[d];
      --d;
      run = (box.offsets[d] + box.shape[d] - index[d]) * inner;
    }
    if (!fn(current, run)) return;
    element += run;
    uint64_t rest = element;
    for (size_t k = rank; k-- > 0;) {
      index[k] = rest % global_shape[k];
      rest /= global_shape[k];
    }
  }
}

}  // namespace ckpt
