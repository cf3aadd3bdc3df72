// Chunk grids: tiles, their chunks, and the runs of a box over them.
#include "ckpt/base/chunk_grid.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <set>

namespace ckpt {
namespace {

// The global row-major index of each element of `box`, in the box's row-major order.
std::vector<uint32_t> BoxIndexes(const std::vector<uint64_t>& shape, const TensorBox& box) {
  std::vector<uint32_t> out;
  BoxRuns runs(shape, box);
  uint64_t first = 0, count = 0;
  while (runs.Next(&first, &count)) {
    for (uint64_t i = 0; i < count; ++i) out.push_back(static_cast<uint32_t>(first + i));
  }
  return out;
}

// Each chunk's elements (their global indexes), straight from the definition: chunk c is run
// c % per_tile of tile c / per_tile's row-major order.
std::vector<std::vector<uint32_t>> ChunksByDefinition(const ChunkGrid& grid) {
  std::vector<std::vector<uint32_t>> chunks(grid.chunk_count());
  for (uint32_t t = 0; t < grid.tile_count(); ++t) {
    const std::vector<uint32_t> tile = BoxIndexes(grid.shape(), grid.TileBox(t));
    for (uint64_t e = 0; e < tile.size(); ++e) {
      chunks[t * grid.chunks_per_tile() + e / grid.chunk_elements()].push_back(tile[e]);
    }
  }
  return chunks;
}

// A grid of random rank (min_rank to 4), tile counts (1 to 3 a dimension), tile extents (1 to
// max_extent) and chunk length; nullopt if ChunkGrid refused it.
std::optional<ChunkGrid> RandomGrid(std::mt19937& rng, size_t min_rank, uint64_t max_extent) {
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  const size_t rank = pick(min_rank, 4);
  std::vector<uint64_t> shape(rank);
  std::vector<uint32_t> counts(rank);
  for (size_t d = 0; d < rank; ++d) {
    counts[d] = static_cast<uint32_t>(pick(1, 3));
    shape[d] = counts[d] * pick(1, max_extent);
  }
  uint64_t elements = 1;
  for (uint64_t d : shape) elements *= d;
  auto grid = ChunkGrid::Make(shape, counts, pick(1, elements + 2));
  EXPECT_TRUE(grid.ok()) << grid.status().ToString();
  if (!grid.ok()) return std::nullopt;
  return *grid;
}

TEST(ChunkGridTest, ColumnTilesOfAMatrixAreTheirOwnRowMajorRuns) {
  const std::vector<uint64_t> shape{4, 6};
  const std::vector<uint32_t> counts{1, 2};
  auto grid = ChunkGrid::Make(shape, counts, 4);
  ASSERT_TRUE(grid.ok()) << grid.status().ToString();
  EXPECT_TRUE(grid->tiled());
  EXPECT_EQ(grid->tile_count(), 2u);
  EXPECT_EQ(grid->chunks_per_tile(), 3u);
  EXPECT_EQ(grid->chunk_count(), 6u);
  EXPECT_EQ(grid->TileBox(1), (TensorBox{{0, 3}, {4, 3}}));
  // Tile 1 is columns 3..5: chunk 3 holds its first 4 elements, (0,3) (0,4) (0,5) (1,3).
  EXPECT_EQ(ChunksByDefinition(*grid)[3], (std::vector<uint32_t>{3, 4, 5, 9}));
  EXPECT_EQ(grid->ChunkElements(5), 4u);
  EXPECT_EQ(grid->TilesInside(TensorBox{{0, 3}, {4, 3}}), std::vector<uint32_t>{1});
  EXPECT_EQ(grid->TilesInside(TensorBox{{0, 2}, {4, 4}}), std::vector<uint32_t>{1});
  EXPECT_TRUE(grid->TilesInside(TensorBox{{1, 3}, {3, 3}}).empty());
  EXPECT_EQ(grid->ChunkRanges(TensorBox{{0, 3}, {1, 3}}),
            (std::vector<std::pair<uint32_t, uint32_t>>{{3, 4}}));
}

TEST(ChunkGridTest, RefusesTilesThatDoNotSplitEvenly) {
  const std::vector<uint64_t> shape{4, 6};
  EXPECT_FALSE(ChunkGrid::Make(shape, std::vector<uint32_t>{1, 4}, 4).ok());
  EXPECT_FALSE(ChunkGrid::Make(shape, std::vector<uint32_t>{0, 1}, 4).ok());
  EXPECT_FALSE(ChunkGrid::Make(shape, std::vector<uint32_t>{2}, 4).ok());
  EXPECT_FALSE(ChunkGrid::Make(shape, {}, 0).ok());
  EXPECT_TRUE(ChunkGrid::Make(shape, {}, 5).ok());
}

// Bands of rows from row 0: they cover the rows in order, each holds at least a chunk's worth of
// each tile's rows (or reaches the end), and every chunk lies in one band.
TEST(ChunkGridTest, BandsOfRowsHoldWholeChunks) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const std::optional<ChunkGrid> grid = RandomGrid(rng, 1, 5);
    ASSERT_TRUE(grid);
    const std::vector<uint64_t>& shape = grid->shape();
    const size_t rank = shape.size();
    const uint64_t row_elements = grid->tile_elements() / grid->tile_shape()[0];
    std::vector<int> band_of(grid->chunk_count(), -1);
    int band = 0;
    for (uint64_t row = 0; row < shape[0]; ++band) {
      const uint64_t end = grid->BandEnd(row);
      ASSERT_GT(end, row);
      ASSERT_LE(end, shape[0]);
      if (end < shape[0]) {
        EXPECT_GE((end - row) * row_elements, grid->chunk_elements());
      }
      TensorBox rows{std::vector<uint64_t>(rank), shape};
      rows.offsets[0] = row;
      rows.shape[0] = end - row;
      for (const auto& [begin, stop] : grid->ChunkRanges(rows)) {
        for (uint32_t c = begin; c < stop; ++c) {
          EXPECT_EQ(band_of[c], -1) << "chunk " << c << " in two bands, trial " << trial;
          band_of[c] = band;
        }
      }
      row = end;
    }
    for (uint32_t c = 0; c < grid->chunk_count(); ++c) EXPECT_NE(band_of[c], -1) << c;
  }
}

// Property: over random shapes, grids and boxes, the runs cover each element of the box once,
// chunk by chunk in order, and copying them gives the box's elements from the chunks as the
// definition cuts them (and back).
TEST(ChunkGridTest, RunsOfRandomBoxesCopyExactlyTheBoxBothWays) {
  std::mt19937 rng(7);
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 400; ++trial) {
    const std::optional<ChunkGrid> grid = RandomGrid(rng, 0, 4);
    ASSERT_TRUE(grid);
    const std::vector<uint64_t>& shape = grid->shape();
    const std::vector<uint32_t>& counts = grid->tile_counts();
    const size_t rank = shape.size();
    uint64_t elements = 1;
    for (uint64_t d : shape) elements *= d;
    const std::vector<std::vector<uint32_t>> chunks = ChunksByDefinition(*grid);
    TensorBox box{std::vector<uint64_t>(rank), std::vector<uint64_t>(rank)};
    for (size_t d = 0; d < rank; ++d) {
      box.offsets[d] = pick(0, shape[d] - 1);
      box.shape[d] = pick(1, shape[d] - box.offsets[d]);
    }
    const std::vector<uint32_t> expected = BoxIndexes(shape, box);

    std::vector<uint32_t> box_values(expected.size(), UINT32_MAX);
    std::set<uint32_t> seen;
    uint32_t previous_chunk = 0;
    grid->ForEachRun(box, [&](const GridRun& run) {
      EXPECT_GE(run.chunk, previous_chunk);
      previous_chunk = run.chunk;
      seen.insert(run.chunk);
      for (uint64_t i = 0; i < run.count; ++i) {
        EXPECT_EQ(box_values[run.box_element + i], UINT32_MAX) << "an element twice";
        box_values[run.box_element + i] = chunks[run.chunk][run.chunk_element + i];
      }
      return true;
    });
    EXPECT_EQ(box_values, expected) << "trial " << trial;

    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    for (uint32_t c : seen) {
      if (!ranges.empty() && ranges.back().second == c) {
        ++ranges.back().second;
      } else {
        ranges.emplace_back(c, c + 1);
      }
    }
    EXPECT_EQ(grid->ChunkRanges(box), ranges);

    // CopyChunkToBox and CopyBoxToChunk, chunk by chunk, both ways.
    std::vector<uint32_t> copied(expected.size(), UINT32_MAX);
    auto box_bytes = std::span<uint8_t>(reinterpret_cast<uint8_t*>(copied.data()),
                                        copied.size() * sizeof(uint32_t));
    for (uint32_t c : seen) {
      std::vector<uint32_t> chunk = chunks[c];
      CopyChunkToBox(*grid, box, c, sizeof(uint32_t),
                     {reinterpret_cast<uint8_t*>(chunk.data()), chunk.size() * sizeof(uint32_t)},
                     box_bytes);
    }
    EXPECT_EQ(copied, expected);
    size_t written = 0;
    for (uint32_t c : seen) {
      EXPECT_EQ(ChunkLengthOf(elements * 4, grid->chunk_elements() * 4, counts, c),
                grid->ChunkElements(c) * 4);
      std::vector<uint32_t> chunk(grid->ChunkElements(c), UINT32_MAX);
      CopyBoxToChunk(*grid, box, c, sizeof(uint32_t), box_bytes,
                     {reinterpret_cast<uint8_t*>(chunk.data()), chunk.size() * sizeof(uint32_t)});
      for (size_t i = 0; i < chunk.size(); ++i) {
        if (chunk[i] != UINT32_MAX) {
          EXPECT_EQ(chunk[i], chunks[c][i]);
          ++written;
        }
      }
    }
    EXPECT_EQ(written, expected.size()) << "every element of the box, copied out once";
  }
}

}  // namespace
}  // namespace ckpt
