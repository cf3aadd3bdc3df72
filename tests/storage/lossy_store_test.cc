// Lossy policies through the store: bounds kept across reopen and policy changes, chunks that
// fall back to lossless inside a lossy chain, chains that restart when deltas outweigh their
// keyframe.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "ckpt/storage/checkpoint_store.h"
#include "store_fixture.h"
#include "store_inspection.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::Bytes;
using testing::CheckpointStoreTest;
using testing::DriftingModel;
using testing::LossyPolicy;
using testing::Sha256Hex;

// The lossy guarantee through the store: every version (restored through its delta chain, from
// the cache and after reopening) is within the bound; 1-D and non-float tensors are exact.
TEST_F(CheckpointStoreTest, LossyVersionsRestoreWithinBoundAcrossReopen) {
  const double bound = 5e-4;
  ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(R"({"mode":"lossy","max_abs_error":5e-4})")).ok());
  DriftingModel model(31, 6000);
  std::vector<std::string> bodies;
  auto push_some = [&](uint64_t from, uint64_t to) {
    for (uint64_t v = from; v <= to; ++v) {
      bodies.push_back(model.Next());
      auto info = Push("m", v, bodies.back());
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      EXPECT_TRUE(info->lossy);
      EXPECT_EQ(info->pushed_sha256, Sha256Hex(bodies.back()));
      EXPECT_NE(info->sha256, info->pushed_sha256);
    }
  };
  push_some(1, 12);
  Reopen();  // cold cache: the next pushes decode their reference from the chain
  push_some(13, 24);
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t v = 1; v <= bodies.size(); ++v) {
      auto body = Restore("m", v);
      ASSERT_TRUE(body.ok()) << body.status().ToString();
      auto check = testing::CheckWithinBound(bodies[v - 1], *body, bound);
      ASSERT_EQ(check.error, "") << "version " << v;
      EXPECT_GT(check.worst, bound / 4) << "the bound should be used";
      auto info = store_->GetVersion("m", v);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->sha256, Sha256Hex(*body));
    }
    Reopen();
  }
  // The version after the restart continued the chain (a delta), it did not start a keyframe.
  auto detail = store_->GetVersionDetail("m", 13);
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  for (const TensorDetail& t : detail->tensors) {
    if (t.name == "layer1.weight") {
      EXPECT_EQ(t.codec, "lossy");
      EXPECT_EQ(t.quantizer, "uniform");
      EXPECT_EQ(t.kind, "delta");
      EXPECT_EQ(t.bound, bound);
      EXPECT_GT(t.bits_per_element, 0);
      EXPECT_LT(t.bits_per_element, 8);
    } else if (t.name != "empty") {              // ("empty" is 2-D: coded lossy, zero elements)
      EXPECT_EQ(t.codec, "lossless") << t.name;  // 1-D, scalar and non-float tensors
    }
  }
}

// A policy change applies from the next push; versions written before keep restoring exactly.
TEST_F(CheckpointStoreTest, SwitchingBetweenLosslessAndLossyKeepsEveryVersion) {
  DriftingModel model(32, 3000);
  std::vector<std::string> bodies;
  std::vector<bool> lossy;
  for (uint64_t v = 1; v <= 12; ++v) {
    const bool quantize = (v / 3) % 2 == 1;  // 3-5 and 9-11 lossy
    ASSERT_TRUE(store_
                    ->SetPolicy("m", quantize
                                         ? LossyPolicy(R"({"mode":"lossy","max_rel_error":1e-3})")
                                         : CodecPolicy{})
                    .ok());
    bodies.push_back(model.Next());
    auto info = Push("m", v, bodies.back());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->lossy, quantize) << v;
    lossy.push_back(quantize);
  }
  for (uint64_t v = 1; v <= 12; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    if (!lossy[v - 1]) {
      EXPECT_EQ(*body, bodies[v - 1]) << v;
    } else {
      // 1e-3 of the weights' range (about 0.4) is well above 2e-4.
      EXPECT_EQ(testing::CheckWithinBound(bodies[v - 1], *body, 1e-3).error, "") << v;
    }
  }
}

// Lossy policies changing between pushes (bound, quantizer, lattice or additive coding, bound
// kind): each push deltas against the reconstruction the previous policy made, the chain goes on,
// and every version keeps the bound it was pushed under, also after reopening.
TEST_F(CheckpointStoreTest, LossyPolicyChangesBetweenPushesKeepEachVersionsBound) {
  struct Step {
    const char* policy;
    double bound;  // absolute; 0: pointwise 1% of each element
  };
  const Step steps[] = {
      {R"({"mode":"lossy","max_abs_error":5e-4})", 5e-4},
      {R"({"mode":"lossy","max_abs_error":2e-4,"quantizer":"cosine"})", 2e-4},
      {R"({"mode":"lossy","max_abs_error":1e-3,"reclaimable":false})", 1e-3},
      {R"({"mode":"lossy","max_abs_error":5e-4,"quantizer":"float"})", 5e-4},
      {R"({"mode":"lossy","max_pointwise_rel_error":1e-2})", 0},
      {R"({"mode":"lossy","max_abs_error":1e-3,"quantizer":"exponent"})", 1e-3},
      {R"({"mode":"lossy","max_abs_error":5e-4})", 5e-4},
  };
  DriftingModel model(33, 6000);
  std::vector<std::string> bodies;
  for (const Step& step : steps) {
    ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(step.policy)).ok()) << step.policy;
    bodies.push_back(model.Next());
    auto info = Push("m", bodies.size(), bodies.back());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_TRUE(info->lossy) << step.policy;
    EXPECT_EQ(info->kind, bodies.size() == 1 ? "keyframe" : "delta") << step.policy;
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t v = 1; v <= bodies.size(); ++v) {
      auto body = Restore("m", v);
      ASSERT_TRUE(body.ok()) << body.status().ToString();
      const Step& step = steps[v - 1];
      std::map<std::string, double> pointwise;  // every tensor, under the pointwise policy
      if (step.bound == 0) {
        uint64_t n = 0;
        std::memcpy(&n, bodies[v - 1].data(), 8);
        auto header = ParseSafetensorsHeader(std::string_view(bodies[v - 1]).substr(8, n),
                                             bodies[v - 1].size());
        ASSERT_TRUE(header.ok());
        for (const TensorInfo& t : header->tensors) pointwise[t.name] = 1e-2;
      }
      EXPECT_EQ(testing::CheckWithinBound(bodies[v - 1], *body, step.bound, pointwise).error, "")
          << step.policy;
      auto info = store_->GetVersion("m", v);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->sha256, Sha256Hex(*body)) << step.policy;
    }
    Reopen();
  }
}

// A bound below the dtype's resolution: chunks fall back to lossless inside the lossy chain, and
// every version restores bit-exactly (which is within any bound).
TEST_F(CheckpointStoreTest, LossyChunksThatDoNotPayAreStoredLosslesslyInTheChain) {
  ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(R"({"mode":"lossy","max_abs_error":1e-9})")).ok());
  DriftingModel model(35, 3000);
  std::vector<std::string> bodies;
  for (uint64_t v = 1; v <= 6; ++v) {
    bodies.push_back(model.Next());
    auto info = Push("m", v, bodies.back());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_LT(info->stored_bytes, info->raw_bytes);
  }
  Reopen();
  for (uint64_t v = 1; v <= 6; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(testing::CheckWithinBound(bodies[v - 1], *body, 1e-9).error, "") << v;
  }
}

// Lossy chains restart when their deltas outweigh their keyframe.
TEST_F(CheckpointStoreTest, LossyChainRestartsWhenDeltasOutweighTheKeyframe) {
  // A coarse bound makes the keyframe tiny; large random moves make the deltas big.
  ASSERT_TRUE(
      store_
          ->SetPolicy("m",
                      LossyPolicy(R"({"mode":"lossy","max_abs_error":0.05,"keyframe_budget":1})"))
          .ok());
  std::mt19937_64 rng(33);
  std::normal_distribution<float> normal(0, 0.01f);
  std::vector<float> w(4096);
  std::vector<std::string> kinds;
  for (uint64_t v = 1; v <= 10; ++v) {
    for (float& x : w) x = v == 1 ? normal(rng) : x + 20 * normal(rng);
    auto info =
        Push("m", v, testing::Serialize({{"w", DType::kF32, {64, 64}, testing::FloatBytes(w)}}));
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    kinds.push_back(info->kind);
  }
  EXPECT_EQ(kinds[0], "keyframe");
  EXPECT_EQ(kinds[1], "delta");
  EXPECT_NE(std::count(kinds.begin() + 1, kinds.end(), "keyframe"), 0);
}

// The drop rule stores its tensor whole in every version (a keyframe, never a delta) and keeps
// its contract there; the other moment deltas against its previous reconstruction as usual.
TEST_F(CheckpointStoreTest, TheDropRuleStoresItsTensorWholeInEveryVersion) {
  ASSERT_TRUE(store_
                  ->SetPolicy("m", LossyPolicy(R"({"mode":"lossy","max_abs_error":1e-3,
                    "overrides":[{"tensors":"*.exp_avg","max_pointwise_rel_error":0.25,
                                  "zero_below_mean":2},
                                 {"tensors":"*.exp_avg_sq","max_pointwise_rel_error":0.1}]})"))
                  .ok());
  std::mt19937_64 rng(34);
  std::normal_distribution<double> normal(0, 1);
  std::vector<float> first(8192), second(8192, 1e-6f);
  for (uint64_t v = 1; v <= 4; ++v) {
    for (size_t i = 0; i < first.size(); ++i) {
      const double g = 1e-3 * normal(rng) * std::exp(normal(rng));
      first[i] = static_cast<float>(0.1 * first[i] + g);
      second[i] = static_cast<float>(0.97 * second[i] + 0.03 * g * g);
    }
    const std::string body =
        testing::Serialize({{"w.exp_avg", DType::kF32, {64, 128}, testing::FloatBytes(first)},
                            {"w.exp_avg_sq", DType::kF32, {64, 128}, testing::FloatBytes(second)}});
    ASSERT_TRUE(Push("m", v, body).ok());
    auto detail = store_->GetVersionDetail("m", v);
    ASSERT_TRUE(detail.ok()) << detail.status().ToString();
    EXPECT_EQ(detail->tensors[0].kind, "keyframe") << v;
    EXPECT_EQ(detail->tensors[1].kind, v == 1 ? "keyframe" : "delta") << v;
    // Most of the first moment is below twice its mean magnitude: it stores far below 32 bits.
    EXPECT_LT(detail->tensors[0].bits_per_element, 6) << v;
    auto restored = Restore("m", v);
    ASSERT_TRUE(restored.ok()) << restored.status().ToString();
    // w.exp_avg is the body's first tensor: its elements start right after the header.
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, restored->data(), 8);
    std::vector<float> m(first.size());
    std::memcpy(m.data(), restored->data() + 8 + header_bytes, m.size() * sizeof(float));
    // The floor is twice the mean |x| of each chunk (the fixture's chunks: 1024 elements).
    constexpr size_t kChunk = 1024;
    std::vector<double> mean(first.size() / kChunk);
    for (size_t i = 0; i < first.size(); ++i) mean[i / kChunk] += std::abs(first[i]) / kChunk;
    for (size_t i = 0; i < first.size(); ++i) {
      const double x = first[i];
      if (m[i] == 0) {
        ASSERT_LE(std::abs(x), 2 * mean[i / kChunk] * (1 + 1e-9)) << v << " element " << i;
      } else {
        ASSERT_LE(std::abs(x - m[i]), 0.25 * std::abs(x)) << v << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
