// Chunk grids (chunk_grid.h).
#include "ckpt/base/chunk_grid.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

namespace ckpt {

namespace {

constexpr uint64_t kMaxTiles = uint64_t{1} << 20;

}  // namespace

Result<ChunkGrid> ChunkGrid::Make(std::span<const uint64_t> shape,
                                  std::span<const uint32_t> tile_counts, uint64_t chunk_elements) {
  ChunkGrid grid;
  grid.shape_.assign(shape.begin(), shape.end());
  if (tile_counts.empty()) {
    grid.counts_.assign(shape.size(), 1);
  } else if (tile_counts.size() != shape.size()) {
    return Status::InvalidArgument("tile counts of rank " + std::to_string(tile_counts.size()) +
                                   " for a tensor of rank " + std::to_string(shape.size()));
  } else {
    grid.counts_.assign(tile_counts.begin(), tile_counts.end());
  }
  if (chunk_elements == 0) return Status::InvalidArgument("chunks of 0 elements");
  grid.chunk_elements_ = chunk_elements;
  uint64_t tiles = 1;
  uint64_t elements = 1;
  grid.tile_shape_.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    const uint32_t n = grid.counts_[d];
    if (n == 0 || shape[d] % n != 0) {
      return Status::InvalidArgument("dimension " + std::to_string(d) + " of extent " +
                                     std::to_string(shape[d]) + " does not split in " +
                                     std::to_string(n) + " equal tiles");
    }
    grid.tile_shape_[d] = shape[d] / n;
    tiles *= n;
    if (tiles > kMaxTiles) return Status::InvalidArgument("more than 2^20 tiles");
    if (__builtin_mul_overflow(elements, grid.tile_shape_[d], &elements)) {
      return Status::InvalidArgument("a tile of more than 2^64 elements");
    }
  }
  grid.tile_count_ = static_cast<uint32_t>(tiles);
  grid.tile_elements_ = elements;
  const uint64_t per_tile = elements / chunk_elements + (elements % chunk_elements != 0);
  if (per_tile * tiles >= (uint64_t{1} << 32)) {
    return Status::InvalidArgument("2^32 chunks or more");
  }
  grid.chunks_per_tile_ = static_cast<uint32_t>(per_tile);
  return grid;
}

TensorBox ChunkGrid::TileBox(uint32_t tile) const {
  TensorBox box{std::vector<uint64_t>(shape_.size()), tile_shape_};
  for (size_t d = shape_.size(); d-- > 0;) {
    box.offsets[d] = (tile % counts_[d]) * tile_shape_[d];
    tile /= counts_[d];
  }
  return box;
}

uint64_t ChunkGrid::ChunkElements(uint32_t chunk) const {
  const uint64_t first = FirstElementInTile(chunk);
  return std::min(chunk_elements_, tile_elements_ - first);
}

std::vector<uint32_t> ChunkGrid::TilesInside(const TensorBox& box) const {
  std::vector<uint32_t> inside;
  for (uint32_t t = 0; t < tile_count_; ++t) {
    const TensorBox tile = TileBox(t);
    bool within = tile.element_count() > 0;
    for (size_t d = 0; d < shape_.size() && within; ++d) {
      within = tile.offsets[d] >= box.offsets[d] &&
               tile.offsets[d] + tile.shape[d] <= box.offsets[d] + box.shape[d];
    }
    if (within) inside.push_back(t);
  }
  return inside;
}

uint64_t ChunkGrid::BandEnd(uint64_t row) const {
  const uint64_t rows = shape_[0];
  if (tile_elements_ == 0) return rows;  // no elements: one band
  const uint64_t tile_rows = tile_shape_[0];
  const uint64_t row_elements = tile_elements_ / tile_rows;
  // Within a tile, a chunk ends on a row boundary every `step` rows.
  const uint64_t step = chunk_elements_ / std::gcd(row_elements, chunk_elements_);
  const uint64_t end = std::min(rows, row + (chunk_elements_ + row_elements - 1) / row_elements);
  const uint64_t tile_row_begin = end - end % tile_rows;
  return std::min(rows,
                  tile_row_begin + std::min(tile_rows, (end % tile_rows + step - 1) / step * step));
}

std::vector<std::pair<uint32_t, uint32_t>> ChunkGrid::ChunkRanges(const TensorBox& box) const {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  ForEachRun(box, [&](const GridRun& run) {
    if (!ranges.empty() && run.chunk < ranges.back().second) return true;
    if (!ranges.empty() && run.chunk == ranges.back().second) {
      ++ranges.back().second;
    } else {
      ranges.emplace_back(run.chunk, run.chunk + 1);
    }
    return true;
  });
  return ranges;
}

uint64_t ChunkLengthOf(uint64_t byte_size, uint64_t chunk_bytes,
                       std::span<const uint32_t> tile_counts, uint32_t chunk) {
  if (chunk_bytes == 0) return 0;  // no grid: its readers report the record
  uint64_t tiles = 1;
  for (uint32_t n : tile_counts) tiles *= n;
  const uint64_t tile_bytes = byte_size / tiles;
  const uint64_t per_tile = std::max<uint64_t>((tile_bytes + chunk_bytes - 1) / chunk_bytes, 1);
  const uint64_t begin = (chunk % per_tile) * chunk_bytes;
  return std::min(chunk_bytes, tile_bytes - begin);
}

namespace {

// The runs of `chunk` over `box`: fn(chunk_element, box_element, count).
template <typename Fn>
void ForEachRunOfChunk(const ChunkGrid& grid, const TensorBox& box, uint32_t chunk, Fn&& fn) {
  grid.ForEachRun(
      box,
      [&](const GridRun& run) {
        if (run.chunk < chunk) return true;
        if (run.chunk > chunk) return false;
        fn(run.chunk_element, run.box_element, run.count);
        return true;
      },
      grid.TileOf(chunk));
}

}  // namespace

void CopyChunkToBox(const ChunkGrid& grid, const TensorBox& box, uint32_t chunk, size_t element,
                    std::span<const uint8_t> chunk_bytes, std::span<uint8_t> box_bytes) {
  ForEachRunOfChunk(grid, box, chunk, [&](uint64_t in_chunk, uint64_t in_box, uint64_t count) {
    std::memcpy(box_bytes.data() + in_box * element, chunk_bytes.data() + in_chunk * element,
                count * element);
  });
}

void CopyBoxToChunk(const ChunkGrid& grid, const TensorBox& box, uint32_t chunk, size_t element,
                    std::span<const uint8_t> box_bytes, std::span<uint8_t> chunk_bytes) {
  ForEachRunOfChunk(grid, box, chunk, [&](uint64_t in_chunk, uint64_t in_box, uint64_t count) {
    std::memcpy(chunk_bytes.data() + in_chunk * element, box_bytes.data() + in_box * element,
                count * element);
  });
}

}  // namespace ckpt
