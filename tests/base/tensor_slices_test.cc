// Box arithmetic of sharded versions: runs of boxes, tilings, declarations, the rank split.
#include "ckpt/base/tensor_slices.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace ckpt {
namespace {

uint64_t Count(const std::vector<uint64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), uint64_t{1}, std::multiplies<>());
}

// The global element indices of `box`, in its row-major order, computed one element at a time.
std::vector<uint64_t> NaiveBoxElements(const std::vector<uint64_t>& global, const TensorBox& box) {
  std::vector<uint64_t> out;
  const uint64_t n = box.element_count();
  for (uint64_t e = 0; e < n; ++e) {
    uint64_t rest = e, global_index = 0, stride = 1;
    std::vector<uint64_t> index(box.shape.size());
    for (size_t d = box.shape.size(); d-- > 0;) {
      index[d] = rest % box.shape[d];
      rest /= box.shape[d];
    }
    for (size_t d = global.size(); d-- > 0;) {
      global_index += (box.offsets[d] + index[d]) * stride;
      stride *= global[d];
    }
    out.push_back(global_index);
  }
  return out;
}

std::vector<uint64_t> BoxElements(const std::vector<uint64_t>& global, const TensorBox& box) {
  std::vector<uint64_t> out;
  BoxRuns runs(global, box);
  uint64_t first = 0, count = 0;
  while (runs.Next(&first, &count)) {
    for (uint64_t i = 0; i < count; ++i) out.push_back(first + i);
  }
  return out;
}

TEST(BoxRuns, CoverEveryBoxInItsOwnOrder) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t rank = rng() % 5;
    std::vector<uint64_t> global(rank);
    TensorBox box;
    for (size_t d = 0; d < rank; ++d) {
      global[d] = 1 + rng() % 6;
      const uint64_t offset = rng() % global[d];
      box.offsets.push_back(offset);
      box.shape.push_back(rng() % (global[d] - offset + 1));  // empty boxes too
    }
    ASSERT_TRUE(CheckBoxWithin("t", box, global).ok());
    EXPECT_EQ(BoxElements(global, box), NaiveBoxElements(global, box)) << "trial " << trial;
  }
}

TEST(BoxRuns, WholeTrailingDimensionsMakeOneRunPerOuterIndex) {
  const std::vector<uint64_t> global = {8, 4, 16};
  BoxRuns runs(global, TensorBox{{2, 0, 0}, {3, 4, 16}});  // rows 2..4, whole otherwise
  uint64_t first = 0, count = 0;
  ASSERT_TRUE(runs.Next(&first, &count));
  EXPECT_EQ(first, 2u * 64);
  EXPECT_EQ(count, 3u * 64);  // one contiguous run
  EXPECT_FALSE(runs.Next(&first, &count));
}

TEST(BoxRuns, ScalarIsOneElement) {
  BoxRuns runs(std::vector<uint64_t>{}, TensorBox{});
  uint64_t first = 9, count = 0;
  ASSERT_TRUE(runs.Next(&first, &count));
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(count, 1u);
  EXPECT_FALSE(runs.Next(&first, &count));
}

// Cuts `global` into a grid of boxes (cuts per dimension chosen at random).
std::vector<TensorBox> RandomGrid(std::mt19937_64& rng, const std::vector<uint64_t>& global) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> parts(global.size());
  for (size_t d = 0; d < global.size(); ++d) {
    uint64_t at = 0;
    while (at < global[d]) {
      const uint64_t len = 1 + rng() % (global[d] - at);
      parts[d].emplace_back(at, len);
      at += len;
    }
  }
  std::vector<TensorBox> boxes(1);
  for (size_t d = 0; d < global.size(); ++d) {
    std::vector<TensorBox> next;
    for (const TensorBox& b : boxes) {
      for (auto [offset, len] : parts[d]) {
        TensorBox c = b;
        c.offsets.push_back(offset);
        c.shape.push_back(len);
        next.push_back(c);
      }
    }
    boxes = std::move(next);
  }
  std::shuffle(boxes.begin(), boxes.end(), rng);
  return boxes;
}

TEST(TileRuns, ReassembleTheGlobalTensorFromItsBoxes) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t rank = 1 + rng() % 4;
    std::vector<uint64_t> global(rank);
    for (auto& d : global) d = 1 + rng() % 7;
    const std::vector<TensorBox> boxes = RandomGrid(rng, global);
    ASSERT_TRUE(CheckTiling("t", global, boxes, [](size_t i) { return std::to_string(i); }).ok());
    // Each box holds the global indices of its elements, in its order.
    std::vector<std::vector<uint64_t>> contents;
    for (const TensorBox& b : boxes) contents.push_back(NaiveBoxElements(global, b));
    std::vector<size_t> cursor(boxes.size(), 0);
    std::vector<uint64_t> assembled;
    ForEachTileRun(global, boxes, [&](size_t b, uint64_t count) {
      for (uint64_t i = 0; i < count; ++i) assembled.push_back(contents[b][cursor[b]++]);
      return true;
    });
    std::vector<uint64_t> expected(Count(global));
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(assembled, expected) << "trial " << trial;
  }
}

TEST(CheckTiling, NamesOverlapsAndGaps) {
  const std::vector<uint64_t> global = {4, 4};
  auto name = [](size_t i) { return "box " + std::to_string(i); };
  std::vector<TensorBox> overlap = {{{0, 0}, {3, 4}}, {{2, 0}, {2, 4}}};
  Status s = CheckTiling("w", global, overlap, name);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("box 0 and box 1 overlap"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'w'"), std::string::npos);
  std::vector<TensorBox> gap = {{{0, 0}, {2, 4}}, {{3, 0}, {1, 4}}};
  s = CheckTiling("w", global, gap, name);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("12 of the 16"), std::string::npos) << s.message();
}

TEST(CheckBoxWithin, RefusesOtherRanksAndBoxesPastTheEnd) {
  const std::vector<uint64_t> global = {4, 4};
  EXPECT_TRUE(CheckBoxWithin("w", TensorBox{{2, 0}, {2, 4}}, global).ok());
  EXPECT_EQ(CheckBoxWithin("w", TensorBox{{3, 0}, {2, 4}}, global).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBoxWithin("w", TensorBox{{0}, {4}}, global).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBoxWithin("w", TensorBox{{UINT64_MAX, 0}, {2, 4}}, global).code(),
            StatusCode::kInvalidArgument);
}

TEST(SliceDeclarations, RoundTripAndRefuseMalformedEntries) {
  std::map<std::string, SliceDeclaration> slices = {{"a", {{8, 4}, {4, 0}}}, {"b", {{}, {}}}};
  std::map<std::string, std::string> metadata = {
      {std::string(kSlicesMetadataKey), SliceDeclarationsJson(slices)}};
  auto parsed = ParseSliceDeclarations(metadata);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->at("a").global_shape, (std::vector<uint64_t>{8, 4}));
  EXPECT_EQ(parsed->at("a").offsets, (std::vector<uint64_t>{4, 0}));
  EXPECT_TRUE(ParseSliceDeclarations({})->empty());
  for (const char* bad : {"[]", "{\"a\": 3}", "{\"a\": {\"offsets\": [0]}}",
                          "{\"a\": {\"global_shape\": [-1], \"offsets\": [0]}}", "not json"}) {
    auto r = ParseSliceDeclarations({{std::string(kSlicesMetadataKey), bad}});
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SplitExtent, GivesTheFirstPartsOneMoreLikeTensorSplit) {
  // torch.tensor_split(torch.arange(10), 4): sizes 3, 3, 2, 2.
  EXPECT_EQ(SplitExtent(10, 0, 4), (std::pair<uint64_t, uint64_t>{0, 3}));
  EXPECT_EQ(SplitExtent(10, 1, 4), (std::pair<uint64_t, uint64_t>{3, 3}));
  EXPECT_EQ(SplitExtent(10, 2, 4), (std::pair<uint64_t, uint64_t>{6, 2}));
  EXPECT_EQ(SplitExtent(10, 3, 4), (std::pair<uint64_t, uint64_t>{8, 2}));
  EXPECT_EQ(SplitExtent(1, 1, 2), (std::pair<uint64_t, uint64_t>{1, 0}));
}

TEST(BoxElementSpan, SpansFromTheFirstToThePastLastElementInRowMajorOrder) {
  const std::vector<uint64_t> global{4, 6};
  // Rows 1..2, whole: exactly that span.
  EXPECT_EQ(BoxElementSpan(global, TensorBox{{1, 0}, {2, 6}}),
            (std::pair<uint64_t, uint64_t>{6, 18}));
  // Columns 2..3 of every row: from row 0's first to row 3's last.
  EXPECT_EQ(BoxElementSpan(global, TensorBox{{0, 2}, {4, 2}}),
            (std::pair<uint64_t, uint64_t>{2, 22}));
  EXPECT_EQ(BoxElementSpan(global, TensorBox{{0, 2}, {4, 0}}),
            (std::pair<uint64_t, uint64_t>{0, 0}));
  EXPECT_EQ(BoxElementSpan({}, TensorBox{{}, {}}), (std::pair<uint64_t, uint64_t>{0, 1}));
}

}  // namespace
}  // namespace ckpt
