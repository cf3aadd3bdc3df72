// The grid a stored tensor's chunks follow (docs/format.md, "ManifestRecord"): the tensor cut in
// equal tiles, tile_counts[d] even parts along dimension d, and each tile's row-major order cut
// in runs of chunk_elements elements (a tile's last run may be shorter). Tiles are numbered in
// the grid's row-major order; chunk c is run c % chunks_per_tile of tile c / chunks_per_tile.
// An untiled tensor (no counts, or every count 1) is one tile: its chunks are runs of the
// tensor's row-major order.
//
// Tiles let the rank that holds a column slice of a matrix code its own chunks: its slice is a
// tile, whole chunks of its own row-major order (docs/sharded-versions.md).
//
// Thread safety: a value; const methods are safe to call concurrently.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/base/tensor_slices.h"

namespace ckpt {

// Elements consecutive both in one chunk and in a box's row-major order.
struct GridRun {
  uint32_t chunk = 0;
  uint64_t chunk_element = 0;  // the run's first element's index in its chunk
  uint64_t box_element = 0;    // ... and in the box's row-major order
  uint64_t count = 0;
};

class ChunkGrid {
 public:
  ChunkGrid() = default;

  // `tile_counts` empty means untiled. InvalidArgument when the counts do not have the shape's
  // rank, a count is 0 or does not divide its dimension, the tiles are more than 2^20, or
  // chunk_elements is 0, or the chunks would number 2^32 or more.
  static Result<ChunkGrid> Make(std::span<const uint64_t> shape,
                                std::span<const uint32_t> tile_counts, uint64_t chunk_elements);

  bool tiled() const { return tile_count_ > 1; }
  const std::vector<uint64_t>& shape() const { return shape_; }
  // Every dimension's count (all 1 when untiled).
  const std::vector<uint32_t>& tile_counts() const { return counts_; }
  uint32_t tile_count() const { return tile_count_; }
  const std::vector<uint64_t>& tile_shape() const { return tile_shape_; }
  uint64_t tile_elements() const { return tile_elements_; }
  uint64_t chunk_elements() const { return chunk_elements_; }
  uint32_t chunks_per_tile() const { return chunks_per_tile_; }
  uint32_t chunk_count() const { return chunks_per_tile_ * tile_count_; }

  // The box tile `tile` (< tile_count) covers.
  TensorBox TileBox(uint32_t tile) const;
  // Chunk `chunk` (< chunk_count): its tile, and its first element's index in the tile's
  // row-major order.
  uint32_t TileOf(uint32_t chunk) const { return chunk / chunks_per_tile_; }
  uint64_t FirstElementInTile(uint32_t chunk) const {
    return uint64_t{chunk % chunks_per_tile_} * chunk_elements_;
  }
  uint64_t ChunkElements(uint32_t chunk) const;
  // The tiles wholly inside `box`, ascending.
  std::vector<uint32_t> TilesInside(const TensorBox& box) const;

  // Calls fn(const GridRun&) over the elements of `box` (REQUIRES CheckBoxWithin against
  // shape()), chunk by chunk in ascending order, each chunk's runs in its own order. Stops when
  // fn returns false. For the whole tensor, an untiled grid's runs are its chunks. With
  // `only_tile`, the runs of that tile only.
  template <typename Fn>
  void ForEachRun(const TensorBox& box, Fn&& fn,
                  std::optional<uint32_t> only_tile = std::nullopt) const;

  // The chunks holding an element of `box`, as ascending [begin, end) ranges.
  std::vector<std::pair<uint32_t, uint32_t>> ChunkRanges(const TensorBox& box) const;

  // Bands of rows (indices of dimension 0), for readers that put a tiled tensor together a band
  // at a time: the end (exclusive) of the band that starts at row `row` (< shape()[0]; rank >=
  // 1). It holds at least a chunk's worth of each tile's rows and ends where a chunk of every
  // tile ends (at the last row otherwise), so that bands starting at such ends hold whole
  // chunks: each chunk is decoded for one band. A tile's chunks that are whole rows of it make
  // a band one chunk of each tile.
  uint64_t BandEnd(uint64_t row) const;

 private:
  std::vector<uint64_t> shape_;
  std::vector<uint32_t> counts_;
  std::vector<uint64_t> tile_shape_;
  uint32_t tile_count_ = 1;
  uint64_t tile_elements_ = 0;
  uint64_t chunk_elements_ = 1;
  uint32_t chunks_per_tile_ = 0;
};

// The length in bytes of chunk `chunk` of a tensor of `byte_size` bytes cut in the tiles of
// `tile_counts` (empty: untiled) and chunks of `chunk_bytes`: ChunkGrid's, without making one.
// REQUIRES: the grid is valid (ChunkGrid::Make accepts it) and chunk < its chunk count.
uint64_t ChunkLengthOf(uint64_t byte_size, uint64_t chunk_bytes,
                       std::span<const uint32_t> tile_counts, uint32_t chunk);

// Copies chunk `chunk`'s elements that lie in `box` between the chunk's bytes and the box's
// (row-major order), through the runs of `grid` over `box`: into the box, or out of it.
void CopyChunkToBox(const ChunkGrid& grid, const TensorBox& box, uint32_t chunk, size_t element,
                    std::span<const uint8_t> chunk_bytes, std::span<uint8_t> box_bytes);
void CopyBoxToChunk(const ChunkGrid& grid, const TensorBox& box, uint32_t chunk, size_t element,
                    std::span<const uint8_t> box_bytes, std::span<uint8_t> chunk_bytes);

// --- Implementation of the templates.

template <typename Fn>
void ChunkGrid::ForEachRun(const TensorBox& box, Fn&& fn, std::optional<uint32_t> only_tile) const {
  const size_t rank = shape_.size();
  if (box.element_count() == 0 || chunks_per_tile_ == 0) return;
  if (rank == 0) {
    fn(GridRun{0, 0, 0, 1});
    return;
  }
  // The tiles the box meets, per dimension: [first, last].
  std::vector<uint64_t> first(rank), last(rank), index(rank);
  for (size_t d = 0; d < rank; ++d) {
    first[d] = box.offsets[d] / tile_shape_[d];
    last[d] = (box.offsets[d] + box.shape[d] - 1) / tile_shape_[d];
  }
  if (only_tile) {
    uint32_t t = *only_tile;
    for (size_t d = rank; d-- > 0;) {
      const uint64_t i = t % counts_[d];
      t /= counts_[d];
      if (i < first[d] || i > last[d]) return;
      first[d] = last[d] = i;
    }
  }
  std::vector<uint64_t> box_stride(rank, 1), tile_stride(rank, 1), outer(rank);
  for (size_t d = rank - 1; d > 0; --d) {
    box_stride[d - 1] = box_stride[d] * box.shape[d];
    tile_stride[d - 1] = tile_stride[d] * tile_shape_[d];
  }
  TensorBox sub{std::vector<uint64_t>(rank), std::vector<uint64_t>(rank)};
  index = first;
  while (true) {
    uint64_t tile = 0;
    for (size_t d = 0; d < rank; ++d) {
      tile = tile * counts_[d] + index[d];
      const uint64_t tile_begin = index[d] * tile_shape_[d];
      const uint64_t begin = std::max(box.offsets[d], tile_begin);
      const uint64_t end = std::min(box.offsets[d] + box.shape[d], tile_begin + tile_shape_[d]);
      sub.offsets[d] = begin - tile_begin;  // within the tile
      sub.shape[d] = end - begin;
    }
    // Runs continue over trailing dimensions that the part covers whole in both the tile and
    // the box.
    size_t split = rank - 1;
    while (split > 0 && sub.shape[split] == tile_shape_[split] &&
           sub.shape[split] == box.shape[split]) {
      --split;
    }
    const uint64_t run = sub.shape[split] * tile_stride[split];
    std::fill(outer.begin(), outer.end(), 0);
    bool more = true;
    while (more) {
      uint64_t in_tile = 0, in_box = 0;
      for (size_t d = 0; d <= split; ++d) {
        const uint64_t i = sub.offsets[d] + (d < split ? outer[d] : 0);
        in_tile += i * tile_stride[d];
        const uint64_t tile_begin = index[d] * tile_shape_[d];
        in_box += (tile_begin + i - box.offsets[d]) * box_stride[d];
      }
      for (uint64_t done = 0; done < run;) {
        const uint64_t e = in_tile + done;
        const uint64_t j = e / chunk_elements_;
        const uint64_t n = std::min(run - done, (j + 1) * chunk_elements_ - e);
        if (!fn(GridRun{static_cast<uint32_t>(tile * chunks_per_tile_ + j), e - j * chunk_elements_,
                        in_box + done, n})) {
          return;
        }
        done += n;
      }
      size_t d = split;
      while (d > 0 && ++outer[d - 1] == sub.shape[d - 1]) outer[--d] = 0;
      more = d > 0;
    }
    size_t d = rank;
    while (d > 0 && ++index[d - 1] > last[d - 1]) {
      index[d - 1] = first[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

}  // namespace ckpt
