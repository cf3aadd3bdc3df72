// Encoded restores (CheckpointStore::OpenEncodedRestore) decoded by the client's decoder
// (EncodedPullDecoder): the same bodies as restores, and, since a version the client holds,
// about the stored delta on the wire.
#include "ckpt/codec/encoded_pull.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "ckpt/codec/edge_encoder.h"
#include "ckpt/storage/retention.h"
#include "store_fixture.h"

namespace ckpt {
namespace {

using testing::Bytes;
using testing::CheckpointStoreTest;
using testing::DriftingModel;
using testing::FloatBytes;
using testing::Serialize;

class EncodedPullTest : public CheckpointStoreTest {
 protected:
  // The encoded body of `version` of "m", since `since` when given.
  Result<std::string> EncodedBody(uint64_t version, std::optional<uint64_t> since) {
    CKPT_ASSIGN_OR_RETURN(auto stream, store_->OpenEncodedRestore("m", version, since, {}));
    return testing::ReadAll(*stream);
  }

  // What a client decodes from `body`, holding `held` (empty: nothing).
  Result<std::string> Decode(std::string_view body, const std::string& held) {
    std::optional<CheckpointView> since;
    if (!held.empty()) {
      CKPT_ASSIGN_OR_RETURN(since, CheckpointView::Parse(Bytes(held)));
    }
    // Several threads: chunks are decoded a window at a time, written in order.
    return testing::DecodeEncodedPull(body, since ? &*since : nullptr, 3, body.size() + 1);
  }
};

TEST_F(EncodedPullTest, DecodesToTheRestoredBodyFromNothingOrSinceTheVersionBefore) {
  for (const char* policy : {R"({"mode":"lossless","keyframe_every":4})",
                             R"({"mode":"lossy","max_abs_error":5e-3,"keyframe_every":4})"}) {
    SCOPED_TRACE(policy);
    ASSERT_TRUE(store_->DeleteModel("m").ok() ||
                store_->DeleteModel("m").code() == StatusCode::kNotFound);
    SetCodecPolicy("m", policy);
    DriftingModel drift(31, 40000);
    std::vector<std::string> restored;
    size_t first_cold = 0;
    for (uint64_t v = 1; v <= 9; ++v) {
      auto pushed = Push("m", v, drift.Next());
      ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
      auto whole = Restore("m", v);
      ASSERT_TRUE(whole.ok());
      restored.push_back(*whole);
      auto cold = EncodedBody(v, std::nullopt);
      ASSERT_TRUE(cold.ok()) << cold.status().ToString();
      auto decoded = Decode(*cold, "");
      ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
      EXPECT_EQ(*decoded, *whole) << v;
      // Holding nothing, a client receives about one keyframe whatever the chain's length (an
      // exact keyframe is coded in place of a longer chain).
      if (v == 1) first_cold = cold->size();
      EXPECT_LT(cold->size(), first_cold * 11 / 10 + 1024) << v;
      if (v == 1) continue;
      auto sync = EncodedBody(v, v - 1);
      ASSERT_TRUE(sync.ok()) << sync.status().ToString();
      auto synced = Decode(*sync, restored[v - 2]);
      ASSERT_TRUE(synced.ok()) << synced.status().ToString();
      EXPECT_EQ(*synced, *whole) << v;
      // A delta version's sync carries its own records (plus the header and the framing).
      if (pushed->kind == "delta") {
        EXPECT_LT(sync->size(), pushed->stored_bytes * 11 / 10 + 1024) << v;
      }
      EXPECT_LE(sync->size(), cold->size()) << v;
    }
    // A client holding a version several links back on the chain (1, three deltas before 4)
    // receives no more than about a cold pull.
    auto far = EncodedBody(4, 1);
    ASSERT_TRUE(far.ok()) << far.status().ToString();
    auto far_decoded = Decode(*far, restored[0]);
    ASSERT_TRUE(far_decoded.ok()) << far_decoded.status().ToString();
    EXPECT_EQ(*far_decoded, restored[3]);
    auto cold = EncodedBody(4, std::nullopt);
    ASSERT_TRUE(cold.ok());
    EXPECT_LE(far->size(), cold->size() * 11 / 10 + 1024);
  }
}

// After the latest version was rearranged into keyframes (its chain no longer runs through the
// version a follower holds), the follower is sent a delta the store codes from its version:
// about the stored delta, bit-identical once decoded, and the same bytes for the next follower
// (coded once, kept). Lossless, and lossy on a plain lattice (a model with retention rules).
TEST_F(EncodedPullTest, AfterARearrangementFollowersAreSentADeltaCodedFromTheirVersion) {
  struct Case {
    const char* policy;
    bool retention;
  };
  for (const Case& c : {Case{R"({"mode":"lossless","keyframe_every":16})", false},
                        Case{R"({"mode":"lossy","max_abs_error":1e-3})", true}}) {
    SCOPED_TRACE(c.policy);
    ASSERT_TRUE(store_->DeleteModel("m").ok() ||
                store_->DeleteModel("m").code() == StatusCode::kNotFound);
    SetCodecPolicy("m", c.policy);
    if (c.retention) {
      ASSERT_TRUE(
          store_->SetRetentionPolicy("m", *RetentionPolicy::FromJson(R"({"keep_last":100})")).ok());
    }
    DriftingModel drift(37, 40000);
    std::string held;
    for (uint64_t v = 1; v <= 5; ++v) {
      auto pushed = Push("m", v, drift.Next());
      ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
      auto rearranged = store_->RearrangeLatest("m", nullptr);
      ASSERT_TRUE(rearranged.ok()) << rearranged.status().ToString();
      auto whole = Restore("m", v);
      ASSERT_TRUE(whole.ok());
      if (v > 1) {
        EXPECT_GT(rearranged->tensors_keyframed, 0u) << v;
        auto cold = EncodedBody(v, std::nullopt);
        auto sync = EncodedBody(v, v - 1);
        ASSERT_TRUE(cold.ok() && sync.ok()) << sync.status().ToString();
        auto synced = Decode(*sync, held);
        ASSERT_TRUE(synced.ok()) << synced.status().ToString();
        EXPECT_EQ(*synced, *whole) << v;
        EXPECT_LT(sync->size(), pushed->stored_bytes * 11 / 10 + 1024) << v;
        EXPECT_LT(sync->size(), cold->size()) << v;
        auto again = EncodedBody(v, v - 1);
        ASSERT_TRUE(again.ok());
        EXPECT_EQ(*again, *sync) << v;
      }
      held = *whole;
    }
  }
}

// Holding nothing, a client pulling a version whose chain's deltas weigh little is sent the
// chain: an exact keyframe, about as large as the chain's own, would save little more than the
// deltas weigh, for a decode and an encode of every chunk. Where the deltas weigh more, exact
// keyframes are coded once: a second pull finds them (or that they were no smaller) and codes
// none.
TEST_F(EncodedPullTest, AColdPullCodesExactKeyframesOnlyWhereTheDeltasWeighAndOnlyOnce) {
  Reopen(64 << 10);  // chunks of thousands of elements: a record's fixed bytes weigh little
  auto coded = [&] { return store_->Stats().pull_chunks_coded; };
  // One tensor of 4 chunks; each version moves every element by `move`, a twentieth of the
  // bound or five times it.
  for (const float move : {5e-5f, 5e-3f}) {
    SCOPED_TRACE(move);
    ASSERT_TRUE(store_->DeleteModel("m").ok() ||
                store_->DeleteModel("m").code() == StatusCode::kNotFound);
    SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":1e-3,"keyframe_every":16})");
    std::mt19937_64 rng(43);
    std::normal_distribution<float> init(0.0f, 0.05f), step(0.0f, move);
    std::vector<float> weights(64 << 10);
    for (float& w : weights) w = init(rng);
    for (uint64_t v = 1; v <= 3; ++v) {
      if (v > 1) {
        for (float& w : weights) w += step(rng);
      }
      ASSERT_TRUE(
          Push("m", v,
               Serialize({{"w", DType::kF32, {weights.size() / 256, 256}, FloatBytes(weights)}}))
              .ok());
    }
    auto whole = Restore("m", 3);
    ASSERT_TRUE(whole.ok());
    const uint64_t before = coded();
    auto cold = EncodedBody(3, std::nullopt);
    ASSERT_TRUE(cold.ok()) << cold.status().ToString();
    auto decoded = Decode(*cold, "");
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, *whole);
    const uint64_t first = coded() - before;
    if (move < 1e-4f) {
      EXPECT_EQ(first, 0u);
    } else {
      EXPECT_EQ(first, 4u);
    }
    auto again = EncodedBody(3, std::nullopt);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *cold);
    EXPECT_EQ(coded() - before, first);
  }
}

TEST_F(EncodedPullTest, DamagedBodiesAndWrongReferencesAreCaught) {
  SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":5e-3})");
  DriftingModel drift(32, 20000);
  const std::string v1 = drift.Next(), v2 = drift.Next();
  ASSERT_TRUE(Push("m", 1, v1).ok());
  ASSERT_TRUE(Push("m", 2, v2).ok());
  auto held = Restore("m", 1);
  ASSERT_TRUE(held.ok());
  auto body = EncodedBody(2, 1);
  ASSERT_TRUE(body.ok());
  ASSERT_TRUE(Decode(*body, *held).ok());
  // Another checkpoint of the same layout held instead of version 1's reconstruction.
  DriftingModel other(33, 20000);
  EXPECT_EQ(Decode(*body, other.Next()).status().code(), StatusCode::kDataLoss);
  // Nothing held.
  EXPECT_EQ(Decode(*body, "").status().code(), StatusCode::kFailedPrecondition);
  for (size_t cut = 0; cut < body->size(); cut += 1 + cut / 3) {
    const Status s = Decode(body->substr(0, cut), *held).status();
    EXPECT_FALSE(s.ok()) << cut;
  }
  std::string flipped = *body;
  flipped[flipped.size() - 20] ^= 1;  // inside the last record's payload
  EXPECT_FALSE(Decode(flipped, *held).ok());
  EXPECT_EQ(store_->OpenEncodedRestore("m", 2, 7, {}).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt
