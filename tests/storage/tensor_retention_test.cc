// Retention's tensor rules through the store: optimizer state dropped from older versions,
// which then restore their weights as valid bodies of their own; what remains restores to the
// same bytes; the space comes back through garbage collection as chains allow.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "ckpt/base/safetensors.h"
#include "ckpt/storage/checkpoint_store.h"
#include "records/keys.h"
#include "store_fixture.h"
#include "store_inspection.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::CheckpointStoreTest;
using testing::LossyPolicy;
using testing::Sha256Hex;

// The tensors of a safetensors body, by name.
std::map<std::string, std::string> TensorsOf(const std::string& body) {
  std::map<std::string, std::string> out;
  uint64_t n = 0;
  std::memcpy(&n, body.data(), 8);
  auto header = ParseSafetensorsHeader(std::string_view(body).substr(8, n), body.size());
  EXPECT_TRUE(header.ok()) << header.status().ToString();
  if (!header.ok()) return out;
  for (const TensorInfo& t : header->tensors) {
    out[t.name] = body.substr(8 + n + t.begin, t.byte_size());
  }
  return out;
}

class TensorRetentionTest : public CheckpointStoreTest,
                            public ::testing::WithParamInterface<const char*> {
 protected:
  // Weights and Adam moments of a drifting model, version v.
  std::string Body(uint64_t v) {
    std::mt19937_64 rng(100 + v);
    std::normal_distribution<double> normal(0, 1);
    for (size_t i = 0; i < w_.size(); ++i) {
      const double g = 1e-3 * normal(rng);
      w_[i] += static_cast<float>(1e-3 * normal(rng));
      m_[i] = static_cast<float>(0.1 * m_[i] + g);
      v_[i] = static_cast<float>(0.97 * v_[i] + 0.03 * g * g);
    }
    return testing::Serialize(
        {{"model.w", DType::kF32, {32, 64}, testing::FloatBytes(w_)},
         {"optim.w.exp_avg", DType::kF32, {32, 64}, testing::FloatBytes(m_)},
         {"optim.w.exp_avg_sq", DType::kF32, {32, 64}, testing::FloatBytes(v_)},
         {"step", DType::kI64, {}, std::string(8, static_cast<char>(v))}},
        {{"format", "pt"}});
  }

  std::vector<float> w_ = std::vector<float>(2048, 0.1f), m_ = std::vector<float>(2048),
                     v_ = std::vector<float>(2048, 1e-6f);
};

// keep_last 2 for optim.*: versions 1, 3 and 4 lose their moments (2 is tagged, 5 and 6 are
// the newest), restore as bodies without them whose other tensors are the bytes they were,
// and say so; the newest restore as before; garbage collection frees what no chain needs; a
// second pass drops nothing more; pushes go on.
TEST_P(TensorRetentionTest, OptimizerStateIsDroppedFromOlderVersionsOnly) {
  ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(GetParam())).ok());
  std::map<uint64_t, std::string> before;
  for (uint64_t v = 1; v <= 6; ++v) {
    ASSERT_TRUE(Push("m", v, Body(v)).ok());
  }
  for (uint64_t v = 1; v <= 6; ++v) before[v] = *Restore("m", v);
  ASSERT_TRUE(store_->SetTag("m", "best", 2).ok());
  const uint64_t stored_before = store_->GetModel("m")->stored_bytes;

  RetentionRun run;
  run.policy =
      *RetentionPolicy::FromJson(R"({"tensor_rules":[{"tensors":"optim.*","keep_last":2}]})");
  run.dry_run = true;
  auto dry = store_->ApplyRetention("m", run);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(dry->tensors_dropped.size(), 3u);
  EXPECT_EQ(*Restore("m", 1), before[1]);  // a dry run changes nothing
  run.dry_run = false;
  auto report = store_->ApplyRetention("m", run);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->deleted.empty());
  const std::vector<std::string> moments = {"optim.w.exp_avg", "optim.w.exp_avg_sq"};
  ASSERT_EQ(report->tensors_dropped.size(), 3u);
  for (uint64_t v : {1, 3, 4}) EXPECT_EQ(report->tensors_dropped.at(v), moments) << v;
  // Under the drop rule the first moment is stored whole in every version: its dropped chunks
  // all go. Delta chains (the second moment; every tensor when lossless) run from version 1
  // to 6: their chunks stay while the newest versions need them.
  const bool drop_rule = std::string(GetParam()).find("zero_below_mean") != std::string::npos;
  if (drop_rule) {
    EXPECT_EQ(report->gc.dropped_tensors_removed, 3u);
    EXPECT_LT(store_->GetModel("m")->stored_bytes, stored_before);
  } else {
    EXPECT_EQ(report->gc.dropped_tensors_removed, 0u);
  }

  auto check = [&] {
    for (uint64_t v = 1; v <= 6; ++v) {
      auto body = Restore("m", v);
      ASSERT_TRUE(body.ok()) << body.status().ToString();
      auto info = store_->GetVersion("m", v);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->sha256, Sha256Hex(*body)) << v;
      EXPECT_EQ(info->raw_bytes, body->size()) << v;
      const bool dropped = v == 1 || v == 3 || v == 4;
      EXPECT_EQ(info->dropped_tensors, dropped ? 2u : 0u) << v;
      if (!dropped) {
        EXPECT_EQ(*body, before[v]) << v;
        continue;
      }
      auto tensors = TensorsOf(*body), old = TensorsOf(before[v]);
      EXPECT_EQ(tensors.size(), 2u) << v;
      EXPECT_EQ(tensors["model.w"], old["model.w"]) << v;
      EXPECT_EQ(tensors["step"], old["step"]) << v;
      EXPECT_EQ(tensors.count("optim.w.exp_avg"), 0u);
      uint64_t n = 0;
      std::memcpy(&n, body->data(), 8);
      EXPECT_EQ(n % 8, 0u);
      EXPECT_NE(body->find("\"format\":\"pt\""), std::string::npos) << "metadata kept";
      auto detail = store_->GetVersionDetail("m", v);
      ASSERT_TRUE(detail.ok());
      EXPECT_FALSE(detail->tensors[0].dropped);
      EXPECT_TRUE(detail->tensors[1].dropped);
      if (drop_rule) {
        EXPECT_EQ(detail->tensors[1].stored_bytes, 0u) << "exp_avg's chunks are gone";
      }
      EXPECT_GT(detail->tensors[2].stored_bytes, 0u) << "exp_avg_sq's chain needs them";
      EXPECT_TRUE(detail->tensors[2].dropped);
      // Byte ranges follow the body without the dropped tensors.
      RestoreSelection range;
      range.bytes = std::make_pair(uint64_t{5}, uint64_t{body->size() - 3});
      auto part = Restore("m", v, range);
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      EXPECT_EQ(*part, body->substr(5, body->size() - 7)) << v;
      // A selection of dropped tensors only is NotFound, saying why.
      RestoreSelection only;
      only.tensors = {"optim.*"};
      auto none = Restore("m", v, only);
      EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
      EXPECT_NE(none.status().message().find("retention's tensor rules dropped them"),
                std::string::npos)
          << none.status().ToString();
      RestoreSelection unknown;
      unknown.tensors = {"no-such-*"};
      EXPECT_EQ(Restore("m", v, unknown).status().code(), StatusCode::kInvalidArgument);
    }
  };
  check();
  auto again = store_->ApplyRetention("m", run);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->tensors_dropped.empty());
  Reopen();
  check();
  auto scrub = store_->Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << (scrub->problems.empty() ? "" : scrub->problems[0]);
  EXPECT_EQ(scrub->orphaned_manifests, 0u);
  // Pushes go on against the newest version, and the next pass drops version 5's moments.
  ASSERT_TRUE(Push("m", 7, Body(7)).ok());
  auto third = store_->ApplyRetention("m", run);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_EQ(third->tensors_dropped.size(), 1u);
  EXPECT_EQ(third->tensors_dropped.count(5), 1u);
  EXPECT_EQ(TensorsOf(*Restore("m", 6)), TensorsOf(before[6]));
}

// With the rule stored before the pushes, the tensors it keeps for the newest 2 versions
// restart their chains every 2 versions: every dropped tensor's chunks go once the versions
// after it in its chain are dropped too, and the weights' chains are untouched.
TEST_P(TensorRetentionTest, ChainsOfRuledTensorsEndSoThatTheirSpaceComesBack) {
  ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(GetParam())).ok());
  ASSERT_TRUE(store_
                  ->SetRetentionPolicy("m", *RetentionPolicy::FromJson(
                                                R"({"tensor_rules":[{"tensors":"optim.*",
                                                     "keep_last":2}]})"))
                  .ok());
  std::map<uint64_t, std::string> before;
  uint64_t removed = 0;
  for (uint64_t v = 1; v <= 8; ++v) {
    ASSERT_TRUE(Push("m", v, Body(v)).ok());
    before[v] = *Restore("m", v);
    auto detail = store_->GetVersionDetail("m", v);
    ASSERT_TRUE(detail.ok());
    EXPECT_EQ(detail->tensors[0].chain_length, v - 1) << "the weights keep one chain";
    EXPECT_LE(detail->tensors[2].chain_length, 1u) << "exp_avg_sq restarts every 2 versions";
    RetentionRun run;
    auto report = store_->ApplyRetention("m", run);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    removed += report->gc.dropped_tensors_removed;
  }
  // Versions 1..6 lost both moments, and every one of them is gone: the chains are versions
  // (1, 2), (3, 4), (5, 6), (7, 8), and 7 starts one.
  EXPECT_EQ(removed, 12u);
  for (uint64_t v = 1; v <= 8; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(TensorsOf(*body)["model.w"], TensorsOf(before[v])["model.w"]) << v;
    EXPECT_EQ(TensorsOf(*body).size(), v <= 6 ? 2u : 4u) << v;
  }
  EXPECT_EQ(*Restore("m", 8), before[8]);
}

// A version can lose tensors in several passes: what a later rule drops comes out of the body
// the earlier one left.
TEST_P(TensorRetentionTest, TensorsDroppedInTwoPassesLeaveTheOthersIntact) {
  ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(GetParam())).ok());
  std::map<uint64_t, std::string> before;
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(Push("m", v, Body(v)).ok());
    before[v] = *Restore("m", v);
  }
  for (const char* rule : {R"({"tensor_rules":[{"tensors":"*.exp_avg","keep_last":1}]})",
                           R"({"tensor_rules":[{"tensors":"optim.*","keep_last":1}]})"}) {
    RetentionRun run;
    run.policy = *RetentionPolicy::FromJson(rule);
    auto report = store_->ApplyRetention("m", run);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->tensors_dropped.size(), 2u) << rule;
    EXPECT_TRUE(report->problems.empty());
  }
  for (uint64_t v = 1; v <= 2; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(store_->GetVersion("m", v)->dropped_tensors, 2u);
    EXPECT_EQ(store_->GetVersion("m", v)->sha256, Sha256Hex(*body));
    auto tensors = TensorsOf(*body), old = TensorsOf(before[v]);
    EXPECT_EQ(tensors.size(), 2u);
    EXPECT_EQ(tensors["model.w"], old["model.w"]);
    EXPECT_EQ(tensors["step"], old["step"]);
  }
  EXPECT_EQ(*Restore("m", 3), before[3]);
}

// A version that does not restore keeps its tensors, the report says why, and the pass goes on
// with the others.
TEST_F(CheckpointStoreTest, AVersionThatDoesNotRestoreKeepsItsTensorsAndThePassGoesOn) {
  CKPT_LOCAL_BACKEND_ONLY("corrupts a chunk record in the store's RocksDB");
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode":"lossless","keyframe_every":1})")).ok());
  for (uint64_t v = 1; v <= 3; ++v) {
    const std::string body = testing::Serialize(
        {{"model.w", DType::kF32, {4}, std::string(16, static_cast<char>(v))},
         {"optim.w.exp_avg", DType::kF32, {4}, std::string(16, static_cast<char>(v + 8))}});
    ASSERT_TRUE(Push("m", v, body).ok());
  }
  store_.reset();
  // Version 1 is the first push: its manifest is seq 1.
  ASSERT_TRUE(testing::PutKey(dir_.str(), "chunks", storage_keys::ChunkKey("m", 1, 0, 0), "x"));
  Reopen();
  RetentionRun run;
  run.policy =
      *RetentionPolicy::FromJson(R"({"tensor_rules":[{"tensors":"optim.*","keep_last":1}]})");
  auto report = store_->ApplyRetention("m", run);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->tensors_dropped.size(), 1u);
  EXPECT_EQ(report->tensors_dropped.count(2), 1u);
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_NE(report->problems[0].find("version 1 keeps its tensors"), std::string::npos)
      << report->problems[0];
  EXPECT_EQ(store_->GetVersion("m", 1)->dropped_tensors, 0u);
  EXPECT_EQ(store_->GetVersion("m", 2)->dropped_tensors, 1u);
}

// Deleting the latest version while the version before it lost tensors to the rules (the
// store keeps the deleted version as the next push's reference then, as a trimmed version lacks
// tensors a push deltas against): every version restores as before, the next push is right
// (exact when lossless), and the scrub is clean.
TEST_P(TensorRetentionTest, DeletingTheLatestAfterTheOneBeforeLostTensors) {
  // Keyframes every other version: version 3's chains do not run through version 2.
  CodecPolicy policy = LossyPolicy(GetParam());
  policy.keyframe_every = 2;
  ASSERT_TRUE(store_->SetPolicy("m", policy).ok());
  for (uint64_t v = 1; v <= 3; ++v) ASSERT_TRUE(Push("m", v, Body(v)).ok());
  RetentionRun run;
  run.policy =
      *RetentionPolicy::FromJson(R"({"tensor_rules":[{"tensors":"optim.*","keep_last":1}]})");
  auto report = store_->ApplyRetention("m", run);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->tensors_dropped.count(2), 1u);
  std::map<uint64_t, std::string> before;
  for (uint64_t v = 1; v <= 2; ++v) before[v] = *Restore("m", v);
  ASSERT_TRUE(store_->DeleteVersion("m", 3).ok());
  for (uint64_t v = 1; v <= 2; ++v) EXPECT_EQ(*Restore("m", v), before[v]) << v;
  const std::string next = Body(4);
  auto pushed = Push("m", 4, next);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  auto restored = Restore("m", 4);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  auto tensors = TensorsOf(*restored), pushed_tensors = TensorsOf(next);
  EXPECT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors["step"], pushed_tensors["step"]);
  if (!pushed->lossy) {
    EXPECT_EQ(*restored, next);
  }
  for (uint64_t v = 1; v <= 2; ++v) EXPECT_EQ(*Restore("m", v), before[v]) << v;
  auto scrub = store_->Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << (scrub->problems.empty() ? "" : scrub->problems[0]);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, TensorRetentionTest,
    ::testing::Values(testing::kLongLosslessChains,
                      R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[],
            "overrides":[{"tensors":"*.exp_avg","max_pointwise_rel_error":0.25,"zero_below_mean":2},
                         {"tensors":"*.exp_avg_sq","max_pointwise_rel_error":0.1}]})"));

}  // namespace
}  // namespace ckpt
