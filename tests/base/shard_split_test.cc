// Splitting one body into the shards of a parallel push: every shard is a valid safetensors
// body, and its tensors and slices put back together give the source tensors exactly.
#include "ckpt/base/shard_split.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "ckpt/base/tensor_slices.h"
#include "test_support.h"

namespace ckpt {
namespace {

struct Source {
  std::string body;
  SafetensorsHeader header;
};

Source MakeSource(const std::vector<std::pair<std::string, std::vector<uint64_t>>>& shapes,
                  std::map<std::string, std::string> metadata = {}) {
  std::mt19937 rng(7);
  std::vector<std::string> data;
  std::vector<TensorSpec> specs;
  for (const auto& [name, shape] : shapes) {
    uint64_t n = 4;
    for (uint64_t d : shape) n *= d;
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    data.push_back(std::move(bytes));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    specs.push_back({shapes[i].first, DType::kF32, shapes[i].second, data[i]});
  }
  Source s;
  s.body = *WriteSafetensors(specs, metadata);
  s.header = *testing::ParseBodyHeader(s.body);
  return s;
}

std::string ShardBody(const Source& source, const ShardBodyPlan& plan) {
  std::string body = plan.header;
  for (const BodyRange& r : plan.ranges) body.append(source.body, r.begin, r.end - r.begin);
  return body;
}

// Puts the shards back together as the store would (row slices of global tensors) and checks
// each tensor against the source; returns the shard count each tensor was spread over.
std::map<std::string, int> CheckReassembles(const Source& source,
                                            const std::vector<ShardBodyPlan>& plans) {
  std::map<std::string, std::string> global;
  std::map<std::string, int> spread;
  for (size_t i = 0; i < plans.size(); ++i) {
    const std::string body = ShardBody(source, plans[i]);
    EXPECT_EQ(body.size(), plans[i].size);
    auto header = testing::ParseBodyHeader(body);
    EXPECT_TRUE(header.ok()) << header.status().message();
    if (!header.ok()) continue;
    if (i != 0) {
      for (const auto& [key, value] : header->metadata) EXPECT_EQ(key, kSlicesMetadataKey);
    }
    auto slices = ParseSliceDeclarations(header->metadata);
    EXPECT_TRUE(slices.ok());
    for (const TensorInfo& t : header->tensors) {
      const std::string bytes = body.substr(8 + header->json_size + t.begin, t.byte_size());
      const TensorInfo* original = nullptr;
      for (const TensorInfo& o : source.header.tensors) {
        if (o.name == t.name) original = &o;
      }
      EXPECT_NE(original, nullptr) << t.name;
      if (!original) continue;
      std::string& g = global[t.name];
      g.resize(original->byte_size());
      uint64_t row = 0;
      if (auto it = slices->find(t.name); it != slices->end()) {
        EXPECT_EQ(it->second.global_shape, original->shape);
        row = it->second.offsets[0];
      } else {
        EXPECT_EQ(t.shape, original->shape);
      }
      const uint64_t row_bytes = original->shape.empty() || original->shape[0] == 0
                                     ? 0
                                     : original->byte_size() / original->shape[0];
      g.replace(row * row_bytes, bytes.size(), bytes);
      ++spread[t.name];
    }
  }
  const uint64_t data_start = 8 + source.header.json_size;
  for (const TensorInfo& o : source.header.tensors) {
    EXPECT_EQ(global[o.name], source.body.substr(data_start + o.begin, o.byte_size())) << o.name;
  }
  return spread;
}

TEST(ShardSplitTest, LargeTensorsAreCutByRowsAndSmallOnesGoWhole) {
  const Source s = MakeSource(
      {{"embed", {1000, 64}}, {"norm", {64}}, {"head", {7, 300}}, {"bias", {3}}, {"scalar", {}}},
      {{"step", "300"}});
  auto plans = SplitIntoShards(s.header, 4);
  ASSERT_TRUE(plans.ok()) << plans.status().message();
  ASSERT_EQ(plans->size(), 4u);
  const auto spread = CheckReassembles(s, *plans);
  EXPECT_EQ(spread.at("embed"), 4);  // 256 KB of 266 KB: above an even share
  EXPECT_EQ(spread.at("head"), 1);   // below it
  EXPECT_EQ(spread.at("scalar"), 1);
  // The metadata goes with shard 0 only.
  EXPECT_NE((*plans)[0].header.find("\"step\":\"300\""), std::string::npos);
  EXPECT_EQ((*plans)[1].header.find("step"), std::string::npos);
}

TEST(ShardSplitTest, UnevenRowsGoToTheFirstShardsAsTensorSplitDoes) {
  const Source s = MakeSource({{"w", {10, 3}}});
  auto plans = SplitIntoShards(s.header, 4);
  ASSERT_TRUE(plans.ok());
  CheckReassembles(s, *plans);
  // 10 rows of 12 bytes over 4 shards: 3, 3, 2, 2.
  const std::vector<uint64_t> expected = {36, 36, 24, 24};
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ((*plans)[i].ranges.size(), 1u);
    EXPECT_EQ((*plans)[i].ranges[0].end - (*plans)[i].ranges[0].begin, expected[i]);
  }
}

TEST(ShardSplitTest, MoreShardsThanTensorsLeavesSomeEmpty) {
  const Source s = MakeSource({{"a", {2, 2}}, {"b", {3}}});
  auto plans = SplitIntoShards(s.header, 5);
  ASSERT_TRUE(plans.ok());
  CheckReassembles(s, *plans);
  int empty = 0;
  for (const ShardBodyPlan& p : *plans) empty += p.ranges.empty();
  EXPECT_EQ(empty, 3);
}

TEST(ShardSplitTest, OneShardIsTheWholeBody) {
  const Source s = MakeSource({{"a", {100, 4}}, {"b", {3}}}, {{"k", "v"}});
  auto plans = SplitIntoShards(s.header, 1);
  ASSERT_TRUE(plans.ok());
  ASSERT_EQ(plans->size(), 1u);
  EXPECT_EQ(ShardBody(s, (*plans)[0]), s.body);
}

TEST(ShardSplitTest, ABodyThatIsItselfASliceKeepsItsGlobalCoordinates) {
  std::map<std::string, SliceDeclaration> own = {{"w", {{40, 8}, {20, 0}}}};
  const Source s =
      MakeSource({{"w", {20, 8}}}, {{std::string(kSlicesMetadataKey), SliceDeclarationsJson(own)}});
  auto plans = SplitIntoShards(s.header, 2);
  ASSERT_TRUE(plans.ok());
  for (size_t i = 0; i < 2; ++i) {
    const std::string& h = (*plans)[i].header;
    const size_t at = h.find("ckptd.slices");
    ASSERT_NE(at, std::string::npos);
    EXPECT_NE(h.find(i == 0 ? "[20,0]" : "[30,0]"), std::string::npos) << h;
    EXPECT_NE(h.find("[40,8]"), std::string::npos) << h;
  }
}

TEST(ShardSplitTest, ShardCountOutOfRangeIsRefused) {
  const Source s = MakeSource({{"a", {4}}});
  EXPECT_EQ(SplitIntoShards(s.header, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitIntoShards(s.header, 65537).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
