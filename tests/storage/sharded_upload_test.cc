// Sharded versions: shards of global tensors pushed apart, assembled atomically, checked
// against each other, kept across a reopen, expired and aborted; restores of parts of a version,
// decoded by the store or sent encoded and decoded by the client's decoder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "ckpt/base/tensor_slices.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_pull.h"
#include "store_fixture.h"

namespace ckpt::testing {
namespace {

// A tensor of a parsed body.
struct BodyTensor {
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  std::string bytes;
};

struct ParsedBody {
  std::map<std::string, BodyTensor> tensors;
  std::map<std::string, std::string> metadata;
};

ParsedBody Parse(const std::string& body) {
  ParsedBody out;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(body[i]);
  auto header = ParseSafetensorsHeader(std::string_view(body).substr(8, n), body.size());
  EXPECT_TRUE(header.ok()) << header.status().ToString();
  if (!header.ok()) return out;
  for (const TensorInfo& t : header->tensors) {
    out.tensors[t.name] = {t.dtype, t.shape, body.substr(8 + n + t.begin, t.byte_size())};
  }
  out.metadata = header->metadata;
  return out;
}

// A row-major float tensor with distinct values.
OwnedTensor Global(const std::string& name, std::vector<uint64_t> shape, float base) {
  std::vector<float> v(ElementCount(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.001f * static_cast<float>(i);
  return {name, DType::kF32, std::move(shape), FloatBytes(v)};
}

// The box of a global tensor as a tensor of its own.
std::string Cut(const OwnedTensor& global, const TensorBox& box) {
  const uint64_t element = DTypeSize(global.dtype);
  std::string out;
  BoxRuns runs(global.shape, box);
  uint64_t first = 0, count = 0;
  while (runs.Next(&first, &count)) out += global.bytes.substr(first * element, count * element);
  return out;
}

// One shard's tensors: (global tensor, box) pairs; a box equal to the whole is sent whole.
using ShardSpec = std::vector<std::pair<const OwnedTensor*, TensorBox>>;

std::string ShardBody(const ShardSpec& spec, std::map<std::string, std::string> metadata = {}) {
  std::vector<OwnedTensor> tensors;
  std::map<std::string, SliceDeclaration> slices;
  for (const auto& [global, box] : spec) {
    tensors.push_back({global->name, global->dtype, box.shape, Cut(*global, box)});
    if (box.shape != global->shape) slices[global->name] = {global->shape, box.offsets};
  }
  if (!slices.empty()) metadata[std::string(kSlicesMetadataKey)] = SliceDeclarationsJson(slices);
  return Serialize(tensors, metadata);
}

TensorBox Whole(const OwnedTensor& t) {
  return {std::vector<uint64_t>(t.shape.size(), 0), t.shape};
}

TensorBox Rows(const OwnedTensor& t, uint64_t begin, uint64_t count) {
  TensorBox b = Whole(t);
  b.offsets[0] = begin;
  b.shape[0] = count;
  return b;
}

TensorBox Columns(const OwnedTensor& t, uint64_t begin, uint64_t count) {
  TensorBox b = Whole(t);
  b.offsets[1] = begin;
  b.shape[1] = count;
  return b;
}

class ShardedUploadTest : public CheckpointStoreTest {
 protected:
  Result<ShardResult> PushShard(std::string_view model, uint64_t version, uint32_t shard,
                                uint32_t of, const std::string& body,
                                const PushOptions& options = {}) {
    CKPT_ASSIGN_OR_RETURN(auto session,
                          store_->BeginShard(model, version, shard, of, body.size(), options));
    for (size_t off = 0; off < body.size(); off += 777) {
      CKPT_RETURN_IF_ERROR(session->Write(Bytes(std::string_view(body).substr(off, 777))));
    }
    return session->Finish();
  }

  // Three shards: `wq` split by rows (unevenly), `wo` by columns, `norm` replicated on every
  // shard, `step` (an I64 scalar) on shard 1 only.
  std::vector<std::string> ThreeShards(float base) {
    wq_ = Global("wq", {9, 40}, base);
    wo_ = Global("wo", {40, 9}, base + 1);
    norm_ = Global("norm", {40}, base + 2);
    step_ = OwnedTensor{"step", DType::kI64, {}, std::string("\x07\0\0\0\0\0\0\0", 8)};
    return {
        ShardBody({{&wq_, Rows(wq_, 0, 4)}, {&wo_, Columns(wo_, 0, 3)}, {&norm_, Whole(norm_)}}),
        ShardBody({{&wq_, Rows(wq_, 4, 3)},
                   {&wo_, Columns(wo_, 3, 3)},
                   {&norm_, Whole(norm_)},
                   {&step_, Whole(step_)}}),
        ShardBody({{&norm_, Whole(norm_)}, {&wo_, Columns(wo_, 6, 3)}, {&wq_, Rows(wq_, 7, 2)}},
                  {{"label.run", "a"}})};
  }

  void ExpectGlobalTensors(const ParsedBody& body) {
    for (const OwnedTensor* t : {&wq_, &wo_, &norm_, &step_}) {
      ASSERT_TRUE(body.tensors.count(t->name)) << t->name;
      const BodyTensor& got = body.tensors.at(t->name);
      EXPECT_EQ(got.shape, t->shape) << t->name;
      EXPECT_EQ(got.dtype, t->dtype) << t->name;
      EXPECT_TRUE(got.bytes == t->bytes) << t->name;
    }
  }

  // No upload is in progress and (where the store spools in its data directory) the spool
  // holds no file.
  void ExpectNoUploadData() {
    auto uploads = store_->ListUploads();
    ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
    EXPECT_TRUE(uploads->empty());
    if (testing::TestSpoolInDataDir()) {
      EXPECT_TRUE(std::filesystem::is_empty(dir_.path() / "uploads"));
    }
  }

  OwnedTensor wq_, wo_, norm_, step_;
};

TEST_F(ShardedUploadTest, ShardsAssembleIntoGlobalTensorsWhenTheLastArrives) {
  const auto shards = ThreeShards(0);
  for (uint32_t shard : {2u, 0u}) {
    auto r = PushShard("m", 10, shard, 3, shards[shard]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->version);
    EXPECT_FALSE(r->upload.committed);
  }
  auto upload = store_->GetUpload("m", 10);
  ASSERT_TRUE(upload.ok());
  EXPECT_EQ(upload->received, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(upload->shard_count, 3u);
  EXPECT_GT(upload->expires_at_ms, upload->created_at_ms);
  // Not visible before the last shard.
  EXPECT_EQ(store_->GetVersion("m", std::nullopt).status().code(), StatusCode::kNotFound);

  auto last = PushShard("m", 10, 1, 3, shards[1]);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_TRUE(last->version);
  EXPECT_TRUE(last->upload.committed);
  EXPECT_EQ(last->version->version, 10u);
  EXPECT_EQ(last->version->tensor_count, 4u);
  EXPECT_EQ(last->version->labels.at("run"), "a");  // shard metadata carries over
  EXPECT_EQ(store_->GetUpload("m", 10).status().code(), StatusCode::kNotFound);

  auto body = Restore("m", 10);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_EQ(Sha256Hex(*body), last->version->sha256);
  const ParsedBody parsed = Parse(*body);
  ExpectGlobalTensors(parsed);
  // The layout travels with the version.
  auto layout = store_->GetShardLayout("m", 10);
  ASSERT_TRUE(layout.ok());
  EXPECT_NE(layout->find("\"shards\":3"), std::string::npos) << *layout;
  EXPECT_NE(layout->find(Sha256Hex(shards[2])), std::string::npos);
  EXPECT_TRUE(parsed.metadata.count("ckptd.layout"));
  EXPECT_FALSE(parsed.metadata.count(std::string(kSlicesMetadataKey)));
}

TEST_F(ShardedUploadTest, AVersionMissingAShardIsInvisibleAndTheLatestStaysThePreviousOne) {
  auto first = ThreeShards(0);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(PushShard("m", 1, i, 3, first[i]).ok());
  auto second = ThreeShards(0.5f);
  ASSERT_TRUE(PushShard("m", 2, 0, 3, second[0]).ok());
  ASSERT_TRUE(PushShard("m", 2, 2, 3, second[2]).ok());
  auto latest = store_->GetVersion("m", std::nullopt);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->version, 1u);
  EXPECT_EQ(store_->ListVersions("m")->size(), 1u);
  auto commit = store_->CommitUpload("m", 2);
  EXPECT_EQ(commit.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(commit.status().message().find("misses 1 of its 3 shards (1)"), std::string::npos)
      << commit.status().message();
}

TEST_F(ShardedUploadTest, AShardSentAgainReplacesItsEarlierAttempt) {
  auto other = ThreeShards(3);  // same layout, other values
  auto good = ThreeShards(0);   // (sets the tensors ExpectGlobalTensors compares with)
  ASSERT_TRUE(PushShard("m", 1, 0, 3, other[0]).ok());
  ASSERT_TRUE(PushShard("m", 1, 0, 3, good[0]).ok());
  ASSERT_TRUE(PushShard("m", 1, 1, 3, good[1]).ok());
  ASSERT_TRUE(PushShard("m", 1, 2, 3, good[2]).ok());
  ExpectGlobalTensors(Parse(*Restore("m", 1)));
}

TEST_F(ShardedUploadTest, AShardSentAgainAfterTheCommitAnswersTheVersion) {
  auto shards = ThreeShards(0);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(PushShard("m", 1, i, 3, shards[i]).ok());
  auto again = PushShard("m", 1, 1, 3, shards[1]);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->sent_again);
  ASSERT_TRUE(again->version);
  EXPECT_EQ(again->version->version, 1u);
  const std::string other_values = ThreeShards(2)[1];
  auto different = PushShard("m", 1, 1, 3, other_values);
  EXPECT_EQ(different.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ListVersions("m")->size(), 1u);
  // A version pushed whole (or as other shards) takes no shards.
  ASSERT_TRUE(Push("m", 2, Serialize({wq_})).ok());
  auto onto_whole = PushShard("m", 2, 0, 3, shards[0]);
  EXPECT_EQ(onto_whole.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(onto_whole.status().message().find("is committed (as 1 shard, not 3)"),
            std::string::npos)
      << onto_whole.status().message();
}

TEST_F(ShardedUploadTest, BadShardsAreRefusedNamingTheTensorAndShardAndStoreNothing) {
  auto shards = ThreeShards(0);
  ASSERT_TRUE(PushShard("m", 1, 0, 3, shards[0]).ok());
  auto expect_refused = [&](uint32_t shard, uint32_t of, const std::string& body, StatusCode code,
                            const std::string& words) {
    auto r = PushShard("m", 1, shard, of, body);
    EXPECT_EQ(r.status().code(), code) << words << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    auto upload = store_->GetUpload("m", 1);
    ASSERT_TRUE(upload.ok());
    EXPECT_EQ(upload->received, std::vector<uint32_t>{0}) << words;
  };
  // Rows 3..5 of wq overlap shard 0's rows 0..3.
  expect_refused(1, 3, ShardBody({{&wq_, Rows(wq_, 3, 3)}}), StatusCode::kInvalidArgument,
                 "tensor 'wq': shard 1 and shard 0 hold overlapping slices");
  OwnedTensor wq_half = wq_;
  wq_half.dtype = DType::kF16;
  wq_half.bytes = wq_.bytes.substr(0, wq_.bytes.size() / 2);
  expect_refused(1, 3, ShardBody({{&wq_half, Rows(wq_half, 4, 3)}}), StatusCode::kInvalidArgument,
                 "disagree on its dtype (F16 and F32)");
  OwnedTensor wq_wide = Global("wq", {9, 41}, 0);
  expect_refused(1, 3, ShardBody({{&wq_wide, Rows(wq_wide, 4, 3)}}), StatusCode::kInvalidArgument,
                 "disagree on its global shape ([9,41] and [9,40])");
  // A slice reaching past its global shape.
  std::map<std::string, SliceDeclaration> past = {{"wo", {{40, 9}, {38, 0}}}};
  expect_refused(1, 3,
                 Serialize({{"wo", DType::kF32, {4, 9}, std::string(144, '\0')}},
                           {{std::string(kSlicesMetadataKey), SliceDeclarationsJson(past)}}),
                 StatusCode::kInvalidArgument,
                 "reaches past the global shape [40,9] in dimension 0");
  expect_refused(1, 4, shards[1], StatusCode::kInvalidArgument, "has 3 shards, not 4");
  expect_refused(3, 3, shards[1], StatusCode::kInvalidArgument, "shard 3 is out of range");
  expect_refused(1, 3, shards[1].substr(0, shards[1].size() - 5), StatusCode::kInvalidArgument,
                 "runs past the end of the body");
  EXPECT_EQ(store_->GetVersion("m", std::nullopt).status().code(), StatusCode::kNotFound);
}

TEST_F(ShardedUploadTest, AGapIsRefusedAtTheCommitAndACorrectedShardCommits) {
  auto shards = ThreeShards(0);
  ASSERT_TRUE(PushShard("m", 1, 0, 3, shards[0]).ok());
  ASSERT_TRUE(PushShard("m", 1, 2, 3, shards[2]).ok());
  // Shard 1 without its rows of wq: wq has a gap.
  auto gap = PushShard(
      "m", 1, 1, 3,
      ShardBody({{&wo_, Columns(wo_, 3, 3)}, {&norm_, Whole(norm_)}, {&step_, Whole(step_)}}));
  EXPECT_EQ(gap.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(gap.status().message().find("tensor 'wq'"), std::string::npos)
      << gap.status().message();
  EXPECT_NE(gap.status().message().find("a gap"), std::string::npos);
  EXPECT_EQ(store_->GetVersion("m", std::nullopt).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(store_->GetUpload("m", 1).ok());
  auto fixed = PushShard("m", 1, 1, 3, shards[1]);
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  ASSERT_TRUE(fixed->version);
  ExpectGlobalTensors(Parse(*Restore("m", 1)));
}

TEST_F(ShardedUploadTest, ReplicasThatDifferAreRefused) {
  auto shards = ThreeShards(0);
  OwnedTensor other_norm = Global("norm", {40}, 9);
  ASSERT_TRUE(PushShard("m", 1, 0, 3, shards[0]).ok());
  ASSERT_TRUE(PushShard("m", 1, 1, 3, shards[1]).ok());
  auto r = PushShard(
      "m", 1, 2, 3,
      ShardBody(
          {{&other_norm, Whole(other_norm)}, {&wo_, Columns(wo_, 6, 3)}, {&wq_, Rows(wq_, 7, 2)}}));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("hold the same slice with different values"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(store_->GetVersion("m", std::nullopt).status().code(), StatusCode::kNotFound);
}

TEST_F(ShardedUploadTest, StoredShardsSurviveAReopen) {
  auto shards = ThreeShards(0);
  ASSERT_TRUE(PushShard("m", 1, 0, 3, shards[0]).ok());
  ASSERT_TRUE(PushShard("m", 1, 1, 3, shards[1]).ok());
  Reopen();
  auto upload = store_->GetUpload("m", 1);
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  EXPECT_EQ(upload->received, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(upload->received_bytes, shards[0].size() + shards[1].size());
  auto last = PushShard("m", 1, 2, 3, shards[2]);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_TRUE(last->version);
  ExpectGlobalTensors(Parse(*Restore("m", 1)));
  // The spool is empty once the version is committed.
  ExpectNoUploadData();
}

TEST_F(ShardedUploadTest, AbortAndExpiryRemoveTheUploadsData) {
  auto shards = ThreeShards(0);
  ASSERT_TRUE(PushShard("m", 1, 0, 3, shards[0]).ok());
  ASSERT_TRUE(store_->AbortUpload("m", 1).ok());
  EXPECT_EQ(store_->GetUpload("m", 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->AbortUpload("m", 1).code(), StatusCode::kNotFound);
  ExpectNoUploadData();

  ASSERT_TRUE(PushShard("m", 2, 1, 3, shards[1]).ok());
  auto kept = store_->ExpireUploads();  // the default expiry is an hour away
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->empty());
  store_.reset();
  StoreOptions options;
  options.data_dir = dir_.str();
  options.min_free_bytes = 0;
  options.upload_expiry = std::chrono::seconds(0);
  testing::ApplyTestStoreBackend(options);
  store_ = std::move(CheckpointStore::Open(options)).value();
  auto expired = store_->ExpireUploads();
  ASSERT_TRUE(expired.ok());
  ASSERT_EQ(expired->size(), 1u);
  EXPECT_EQ((*expired)[0].version, 2u);
  EXPECT_EQ(store_->GetUpload("m", 2).status().code(), StatusCode::kNotFound);
  ExpectNoUploadData();
}

TEST_F(ShardedUploadTest, DeletingTheModelRemovesItsUploads) {
  auto shards = ThreeShards(0);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(PushShard("m", 1, i, 3, shards[i]).ok());
  ASSERT_TRUE(PushShard("m", 2, 0, 3, shards[0]).ok());
  ASSERT_TRUE(store_->DeleteModel("m").ok());
  EXPECT_EQ(store_->GetUpload("m", 2).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->ListUploads()->empty());
}

TEST_F(ShardedUploadTest, DeltasLineUpAcrossAChangeOfLayout) {
  // Version 1 as 3 shards; version 2 (the same values, slightly moved) as 2 shards cut
  // elsewhere: every tensor of version 2 is a delta against version 1's global tensor.
  auto v1 = ThreeShards(0);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(PushShard("m", 1, i, 3, v1[i]).ok());
  OwnedTensor wq = Global("wq", {9, 40}, 0.0001f), wo = Global("wo", {40, 9}, 1.0001f);
  OwnedTensor norm = norm_, step = step_;
  auto a = PushShard("m", 2, 0, 2,
                     ShardBody({{&wq, Rows(wq, 0, 5)}, {&wo, Whole(wo)}, {&norm, Whole(norm)}}));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = PushShard("m", 2, 1, 2, ShardBody({{&wq, Rows(wq, 5, 4)}, {&step, Whole(step)}}));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->version);
  auto detail = store_->GetVersionDetail("m", 2);
  ASSERT_TRUE(detail.ok());
  for (const TensorDetail& t : detail->tensors) EXPECT_EQ(t.kind, "delta") << t.name;
  const ParsedBody restored = Parse(*Restore("m", 2));
  EXPECT_TRUE(restored.tensors.at("wq").bytes == wq.bytes);
  EXPECT_TRUE(restored.tensors.at("wo").bytes == wo.bytes);
}

TEST_F(ShardedUploadTest, LossyShardsKeepTheClosedLoopAndTheBoundAcrossAChangeOfLayout) {
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.001})")).ok());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> noise(0, 0.01f);
  std::vector<float> values(64 * 48);
  for (float& x : values) x = noise(rng) * 10;
  for (uint64_t version = 1; version <= 6; ++version) {
    for (float& x : values) x += noise(rng);
    OwnedTensor w{"w", DType::kF32, {64, 48}, FloatBytes(values)};
    // Odd versions by rows in 4 shards, even ones by columns in 3.
    const uint32_t of = version % 2 ? 4 : 3;
    std::optional<VersionInfo> info;
    for (uint32_t shard = 0; shard < of; ++shard) {
      auto [offset, length] = SplitExtent(version % 2 ? 64 : 48, shard, of);
      const TensorBox box = version % 2 ? Rows(w, offset, length) : Columns(w, offset, length);
      auto r = PushShard("m", version, shard, of, ShardBody({{&w, box}}));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (r->version) info = r->version;
    }
    ASSERT_TRUE(info) << version;
    EXPECT_TRUE(info->lossy);
    const ParsedBody restored = Parse(*Restore("m", version));
    const std::string& got = restored.tensors.at("w").bytes;
    ASSERT_EQ(got.size(), w.bytes.size());
    double worst = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      float x = 0;
      std::memcpy(&x, got.data() + 4 * i, 4);
      worst = std::max(worst, std::abs(static_cast<double>(x) - values[i]));
    }
    EXPECT_LE(worst, 0.001) << "version " << version;
    if (version > 1) {
      auto detail = store_->GetVersionDetail("m", version);
      EXPECT_EQ(detail->tensors[0].kind, "delta") << version;
    }
  }
}

TEST_F(ShardedUploadTest, RestoresSendTheSelectedTensorsAPartForARankOrOneBox) {
  auto shards = ThreeShards(0);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(PushShard("m", 1, i, 3, shards[i]).ok());

  RestoreSelection only_w;
  only_w.tensors = {"w*"};
  const ParsedBody w = Parse(*Restore("m", 1, only_w));
  EXPECT_EQ(w.tensors.size(), 2u);
  EXPECT_TRUE(w.tensors.at("wq").bytes == wq_.bytes);
  EXPECT_TRUE(w.tensors.at("wo").bytes == wo_.bytes);

  // 3 shards resharded for 2 ranks: wq by rows (5 + 4), wo by columns (5 + 4), the rest whole.
  for (uint32_t rank = 0; rank < 2; ++rank) {
    RestoreSelection part;
    part.rank = rank;
    part.ranks = 2;
    const ParsedBody p = Parse(*Restore("m", std::nullopt, part));
    const TensorBox rows = Rows(wq_, rank * 5, rank ? 4 : 5);
    const TensorBox cols = Columns(wo_, rank * 5, rank ? 4 : 5);
    EXPECT_EQ(p.tensors.at("wq").shape, rows.shape);
    EXPECT_TRUE(p.tensors.at("wq").bytes == Cut(wq_, rows)) << rank;
    EXPECT_EQ(p.tensors.at("wo").shape, cols.shape);
    EXPECT_TRUE(p.tensors.at("wo").bytes == Cut(wo_, cols)) << rank;
    EXPECT_TRUE(p.tensors.at("norm").bytes == norm_.bytes);
    EXPECT_TRUE(p.tensors.at("step").bytes == step_.bytes);
    auto slices = ParseSliceDeclarations(p.metadata);
    ASSERT_TRUE(slices.ok());
    EXPECT_EQ(slices->at("wq").offsets, rows.offsets);
    EXPECT_EQ(slices->at("wo").global_shape, wo_.shape);
    EXPECT_FALSE(slices->count("norm"));
  }

  RestoreSelection box;
  box.box = std::make_pair(std::string("wo"), TensorBox{{10, 2}, {7, 5}});
  const ParsedBody b = Parse(*Restore("m", 1, box));
  ASSERT_EQ(b.tensors.size(), 1u);
  EXPECT_TRUE(b.tensors.at("wo").bytes == Cut(wo_, box.box->second));

  box.box->second = TensorBox{{38, 0}, {3, 9}};
  EXPECT_EQ(Restore("m", 1, box).status().code(), StatusCode::kInvalidArgument);
  box.box->first = "nope";
  EXPECT_EQ(Restore("m", 1, box).status().code(), StatusCode::kNotFound);
  RestoreSelection none;
  none.tensors = {"x*"};
  EXPECT_EQ(Restore("m", 1, none).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ShardedUploadTest, AWholePushHasAOneShardLayoutAndReshardsByNothing) {
  auto shards = ThreeShards(0);
  const std::string body = Serialize({wq_, wo_});
  ASSERT_TRUE(Push("m", 1, body).ok());
  auto layout = store_->GetShardLayout("m", 1);
  ASSERT_TRUE(layout.ok());
  EXPECT_NE(layout->find("\"shards\":1"), std::string::npos) << *layout;
  RestoreSelection part;
  part.rank = 1;
  part.ranks = 2;
  const ParsedBody p = Parse(*Restore("m", 1, part));
  EXPECT_TRUE(p.tensors.at("wq").bytes == wq_.bytes);  // whole: no layout to follow
}

TEST_F(ShardedUploadTest, AByteRangeDecodesOnlyTheChunksHoldingIt) {
  DriftingModel drift(3, 20000);
  std::vector<std::string> bodies;
  PushVersions(drift, 1, 3, &bodies);
  const std::string& body = bodies.back();
  Reopen();  // nothing in memory: every chunk read decodes its chain
  auto full_before = store_->Stats().restore_links_decoded;
  ASSERT_TRUE(Restore("m", 3).ok());
  const uint64_t full_links = store_->Stats().restore_links_decoded - full_before;
  Reopen();
  for (auto [first, last] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 7}, {5, 40000}, {body.size() - 10, body.size() - 1}, {100, body.size() + 50}}) {
    RestoreSelection range;
    range.bytes = std::make_pair(first, last);
    const uint64_t before = store_->Stats().restore_links_decoded;
    auto got = Restore("m", 3, range);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const uint64_t end = std::min<uint64_t>(last, body.size() - 1);
    EXPECT_TRUE(*got == body.substr(first, end - first + 1)) << first << "-" << last;
    if (last - first < 100) {
      EXPECT_LT(store_->Stats().restore_links_decoded - before, full_links / 4);
    }
  }
  RestoreSelection past;
  past.bytes = std::make_pair(uint64_t{body.size()}, uint64_t{body.size() + 1});
  EXPECT_EQ(Restore("m", 3, past).status().code(), StatusCode::kInvalidArgument);
}

// An encoded pull of a part (chosen tensors, a rank's view, one box) decodes, on the client's
// decoder, to the body a restore of that part sends, over chains of several links; a rank's view
// of tensors split by rows receives only the chunks holding its rows.
TEST_F(ShardedUploadTest, EncodedPullsOfAPartDecodeToWhatItsRestoreSends) {
  Reopen(/*chunk_bytes=*/1024);  // every tensor spans several chunks
  SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":1e-3,"keyframe_every":8})");
  auto encoded_body = [&](const RestoreSelection& selection) -> Result<std::string> {
    CKPT_ASSIGN_OR_RETURN(auto stream,
                          store_->OpenEncodedRestore("m", std::nullopt, std::nullopt, selection));
    EXPECT_EQ(stream->info().version, 3u);
    return ReadAll(*stream);
  };
  auto decode = [](std::string_view body) {
    bool whole_version = true;
    auto decoded = DecodeEncodedPull(body, nullptr, 2, 999, &whole_version);
    EXPECT_FALSE(decoded.ok() && whole_version);
    return decoded;
  };
  OwnedTensor wq, wo, norm;
  for (uint64_t version = 1; version <= 3; ++version) {
    const float base = 0.01f * static_cast<float>(version);
    wq = Global("wq", {64, 40}, base);  // 10 KiB: split by rows
    wo = Global("wo", {40, 64}, base);  // split by columns
    norm = Global("norm", {300}, base);
    for (uint32_t shard = 0; shard < 4; ++shard) {
      const auto pushed = PushShard("m", version, shard, 4,
                                    ShardBody({{&wq, Rows(wq, shard * 16, 16)},
                                               {&wo, Columns(wo, shard * 16, 16)},
                                               {&norm, Whole(norm)}}));
      ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
    }
  }
  auto whole = encoded_body(RestoreSelection{});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();

  std::vector<RestoreSelection> parts(7);
  parts[0].tensors = {"w*"};
  parts[1].rank = 0, parts[1].ranks = 2;
  parts[2].rank = 1, parts[2].ranks = 2;
  parts[3].rank = 2, parts[3].ranks = 3;  // cuts through chunks and rows unevenly
  parts[4].tensors = {"wq"}, parts[4].rank = 3, parts[4].ranks = 4;
  parts[5].box = std::make_pair(std::string("wo"), TensorBox{{5, 7}, {30, 9}});
  parts[6].box = std::make_pair(std::string("wq"), TensorBox{{64, 0}, {0, 40}});  // empty
  for (size_t i = 0; i < parts.size(); ++i) {
    SCOPED_TRACE(i);
    auto expected = Restore("m", 3, parts[i]);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    auto body = encoded_body(parts[i]);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    auto decoded = decode(*body);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_TRUE(*decoded == *expected);
    EXPECT_LT(body->size(), whole->size());
  }
  // wq alone for the last of 4 ranks: its 16 rows (2.5 KiB), at most 4 of the 10 chunks.
  auto quarter = encoded_body(parts[4]);
  RestoreSelection all_wq;
  all_wq.tensors = {"wq"};
  auto full_wq = encoded_body(all_wq);
  ASSERT_TRUE(quarter.ok() && full_wq.ok());
  EXPECT_LT(quarter->size() * 2, full_wq->size());

  // A damaged part body is refused: cut anywhere, or its part frame (wq's, the first tensor's,
  // right after the preamble) altered.
  auto part_body = encoded_body(parts[1]);
  ASSERT_TRUE(part_body.ok());
  for (size_t cut = 0; cut < part_body->size(); cut += 1 + cut / 5) {
    EXPECT_FALSE(decode(part_body->substr(0, cut)).ok()) << cut;
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, part_body->data() + 24, 8);  // little-endian, as the format
  const size_t frame = 32 + header_length;
  ASSERT_EQ((*part_body)[frame], 3);
  for (const auto& [at, value] : std::vector<std::pair<size_t, char>>{
           {frame + 1, 1},              // another tensor
           {frame + 5, 7},              // stored bytes
           {frame + 13, 3},             // chunk bytes: not a multiple of the element
           {frame + 21, 3},             // dimensions
           {frame + 22 + 2 * 8, 40},    // rows past the stored tensor
           {frame + 22 + 3 * 8, 1},     // columns past the stored tensor
           {frame + 22 + 2 * 8, 8}}) {  // another box: other chunks than those sent
    std::string damaged = *part_body;
    damaged[at] = value;
    const Status status = decode(damaged).status();
    EXPECT_FALSE(status.ok()) << at - frame;
  }

  // Parts are sent whole: never since a version, never a byte range.
  EXPECT_EQ(store_->OpenEncodedRestore("m", 3, 2, parts[1]).status().code(),
            StatusCode::kInvalidArgument);
  RestoreSelection range;
  range.bytes = std::make_pair(uint64_t{0}, uint64_t{99});
  EXPECT_EQ(store_->OpenEncodedRestore("m", 3, std::nullopt, range).status().code(),
            StatusCode::kInvalidArgument);
  RestoreSelection none;
  none.tensors = {"x*"};
  EXPECT_EQ(store_->OpenEncodedRestore("m", 3, std::nullopt, none).status().code(),
            StatusCode::kInvalidArgument);
}

// Tiles whose rows outgrow a chunk (a row of a tile is 1200 bytes, a chunk 1024): a band of the
// restore ends where a chunk of every tile does, and the body is the one pushed.
TEST_F(ShardedUploadTest, ATiledTensorWhoseRowsOutgrowAChunkRestoresByBands) {
  Reopen(/*chunk_bytes=*/1024);
  const OwnedTensor wide = Global("wide", {24, 1200}, 0.5f);
  for (uint32_t shard = 0; shard < 4; ++shard) {
    ASSERT_TRUE(
        PushShard("m", 1, shard, 4, ShardBody({{&wide, Columns(wide, shard * 300, 300)}})).ok());
  }
  auto detail = store_->GetVersionDetail("m", 1);
  ASSERT_TRUE(detail.ok());
  ASSERT_EQ(detail->tensors[0].tiles, (std::vector<uint32_t>{1, 4}));
  auto stream = store_->OpenRestore("m", 1);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  std::string body;
  size_t pieces = 0, largest = 0;
  for (;;) {
    auto piece = (*stream)->Next();
    ASSERT_TRUE(piece.ok()) << piece.status().ToString();
    if (piece->empty()) break;
    ++pieces;
    largest = std::max(largest, piece->size());
    body.append(reinterpret_cast<const char*>(piece->data()), piece->size());
  }
  EXPECT_LT(largest, wide.bytes.size()) << "the tensor was put together whole";
  EXPECT_GT(pieces, 2u);
  auto restored = Restore("m", 1);
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(body == *restored);
  EXPECT_TRUE(Parse(body).tensors["wide"].bytes == wide.bytes);  // the default: lossless
  // Byte ranges and boxes put bands of it together, from any row.
  for (const auto& [first, last] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 0}, {body.size() - 1, body.size() - 1}, {200, 40000}, {body.size() / 2, 1u << 30}}) {
    RestoreSelection range;
    range.bytes = std::make_pair(first, last);
    auto got = Restore("m", 1, range);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(*got == body.substr(first, last - first + 1)) << first << "-" << last;
  }
  for (const TensorBox& box : {TensorBox{{3, 250}, {17, 700}}, Columns(wide, 600, 300)}) {
    RestoreSelection selection;
    selection.box = std::make_pair(std::string("wide"), box);
    auto got = Restore("m", 1, selection);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(Parse(*got).tensors.at("wide").bytes == Cut(wide, box));
  }
}

// A tensor cut by columns is stored in tiles, one a rank: its whole, a follower's sync, a
// rank's tile and any box of it decode on the client to what a restore sends; a rank's tile is
// only its tile's chunks; a damaged tiles frame is refused.
TEST_F(ShardedUploadTest, TiledTensorsPullEncodedWholeSinceAVersionOrByTheirTiles) {
  Reopen(/*chunk_bytes=*/1024);  // a tile spans several chunks
  SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":1e-3})");
  auto encoded_body = [&](std::optional<uint64_t> since,
                          const RestoreSelection& selection) -> Result<std::string> {
    CKPT_ASSIGN_OR_RETURN(auto stream,
                          store_->OpenEncodedRestore("m", std::nullopt, since, selection));
    return ReadAll(*stream);
  };
  OwnedTensor wo, norm;
  std::vector<std::string> restored;
  for (uint64_t version = 1; version <= 3; ++version) {
    wo = Global("wo", {40, 60}, 0.01f * static_cast<float>(version));
    norm = Global("norm", {300}, 0.0f);
    for (uint32_t shard = 0; shard < 4; ++shard) {
      ASSERT_TRUE(PushShard("m", version, shard, 4,
                            ShardBody({{&wo, Columns(wo, shard * 15, 15)}, {&norm, Whole(norm)}}))
                      .ok());
    }
    auto r = Restore("m", version);
    ASSERT_TRUE(r.ok());
    restored.push_back(*r);
  }
  auto detail = store_->GetVersionDetail("m", 3);
  ASSERT_TRUE(detail.ok());
  for (const TensorDetail& t : detail->tensors) {
    const std::vector<uint32_t> tiles =
        t.name == "wo" ? std::vector<uint32_t>{1, 4} : std::vector<uint32_t>{};
    EXPECT_EQ(t.tiles, tiles) << t.name;
    EXPECT_EQ(t.kind, "delta") << t.name;
  }
  // A tile (40 rows of 15 elements, 2400 bytes) is cut in chunks of whole rows: 4 of 10 rows.
  EXPECT_EQ(detail->tensors[detail->tensors[0].name == "wo" ? 0 : 1].chunk_bytes, 600u);
  // A restore sends the tiled tensor in bands of rows (10 rows of 60 elements: a chunk of each
  // tile), never putting it together whole.
  {
    auto stream = store_->OpenRestore("m", 3);
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    std::string body;
    size_t largest = 0;
    for (;;) {
      auto piece = (*stream)->Next();
      ASSERT_TRUE(piece.ok()) << piece.status().ToString();
      if (piece->empty()) break;
      largest = std::max(largest, piece->size());
      body.append(reinterpret_cast<const char*>(piece->data()), piece->size());
    }
    EXPECT_EQ(largest, 10u * 60 * 4);
    EXPECT_TRUE(body == restored[2]);
  }

  auto whole = encoded_body(std::nullopt, RestoreSelection{});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ((*whole)[7], 3) << "format 3: a whole version with tiles";
  bool whole_version = false;
  auto decoded = DecodeEncodedPull(*whole, nullptr, 2, 777, &whole_version);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(whole_version);
  EXPECT_TRUE(*decoded == restored[2]);
  // Tiles frames come in formats 3 and 4 only.
  std::string as_format_1 = *whole;
  as_format_1[7] = 1;
  EXPECT_FALSE(DecodeEncodedPull(as_format_1, nullptr, 1, 999).ok());

  auto held = CheckpointView::Parse(Bytes(restored[1]));
  ASSERT_TRUE(held.ok());
  auto since = encoded_body(2, RestoreSelection{});
  ASSERT_TRUE(since.ok()) << since.status().ToString();
  EXPECT_LT(since->size(), whole->size());
  auto synced = DecodeEncodedPull(*since, &*held, 2, 999);
  ASSERT_TRUE(synced.ok()) << synced.status().ToString();
  EXPECT_TRUE(*synced == restored[2]);
  // Held by a client whose copy differs: its since-links do not decode to their records.
  std::string other = restored[1];
  other.replace(other.size() - 1300, 8, 8, '\x7f');  // inside wo's last tile
  auto other_view = CheckpointView::Parse(Bytes(other));
  EXPECT_EQ(DecodeEncodedPull(*since, &*other_view, 2, 999).status().code(), StatusCode::kDataLoss);

  RestoreSelection tile, box, rank;
  tile.box = std::make_pair(std::string("wo"), Columns(wo, 30, 15));
  box.box = std::make_pair(std::string("wo"), TensorBox{{5, 7}, {30, 20}});
  rank.rank = 1, rank.ranks = 4;
  for (const RestoreSelection& part : {tile, box, rank}) {
    auto expected = Restore("m", 3, part);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    auto body = encoded_body(std::nullopt, part);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ((*body)[7], 4) << "format 4: a part with tiles";
    auto got = DecodeEncodedPull(*body, nullptr, 2, 555, &whole_version);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_FALSE(whole_version);
    EXPECT_TRUE(*got == *expected);
  }
  // A tile is a quarter of the tensor: about a quarter of its chunks' bytes.
  RestoreSelection all_wo;
  all_wo.tensors = {"wo"};
  auto tile_body = encoded_body(std::nullopt, tile), wo_body = encoded_body(std::nullopt, all_wo);
  ASSERT_TRUE(tile_body.ok() && wo_body.ok());
  EXPECT_LT(tile_body->size() * 3, wo_body->size());

  // The tiles frame (the first tensor's, after the preamble) altered: refused.
  uint64_t header_length = 0;
  std::memcpy(&header_length, tile_body->data() + 24, 8);
  const size_t frame = 32 + header_length;
  ASSERT_EQ((*tile_body)[frame], 4);
  for (const auto& [at, value] : std::vector<std::pair<size_t, char>>{
           {frame + 5, 3},               // chunk bytes: not a multiple of the element
           {frame + 13, 3},              // dimensions
           {frame + 14 + 4 * 8, 3},      // tiles that do not split the rows
           {frame + 14 + 4 * 8 + 4, 2},  // other tiles: other chunks than those sent
           {frame + 14 + 3 * 8, 60}}) {  // a box past the stored tensor
    std::string damaged = *tile_body;
    damaged[at] = value;
    EXPECT_FALSE(DecodeEncodedPull(damaged, nullptr, 1, 999).ok()) << at - frame;
  }
  for (size_t cut = 0; cut < tile_body->size(); cut += 1 + cut / 5) {
    EXPECT_FALSE(DecodeEncodedPull(tile_body->substr(0, cut), nullptr, 1, 999).ok()) << cut;
  }
}

TEST_F(ShardedUploadTest, LargeRunsOfABoxAreSentFromTheDecodedChunks) {
  Reopen(/*chunk_bytes=*/256 << 10);  // a row slice then spans several chunks, partly
  const OwnedTensor w = Global("w", {1024, 256}, 0);
  ASSERT_TRUE(Push("m", 1, Serialize({w})).ok());
  for (const TensorBox& box : {Rows(w, 100, 800), Rows(w, 0, 1024), Columns(w, 3, 250)}) {
    RestoreSelection selection;
    selection.box = std::make_pair(std::string("w"), box);
    auto got = Restore("m", 1, selection);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(Parse(*got).tensors.at("w").bytes == Cut(w, box));
  }
}

// Spool format 1 (docs/format.md), written byte for byte as a daemon of that format leaves it:
// a store opening it finds the upload and its shard and continues it.
TEST_F(ShardedUploadTest, ReadsASpoolOfFormat1) {
  if (!testing::TestSpoolInDataDir()) GTEST_SKIP() << "the store spools in its shared backend";
  auto shards = ThreeShards(0);
  store_.reset();
  const auto dir = dir_.path() / "uploads" / "m" / "7";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "upload.json")
      << R"({"format":1,"model":"m","version":7,"shard_count":3,"created_at_ms":1764600000000})";
  std::string file = shards[1];
  file += "CKSHARD1";
  for (int i = 0; i < 8; ++i)
    file.push_back(static_cast<char>((shards[1].size() >> (8 * i)) & 0xff));
  file += Sha256Hex(shards[1]);
  std::ofstream(dir / "shard-1", std::ios::binary) << file;
  std::ofstream(dir / ".partial-123-0", std::ios::binary) << "left by a crash";
  Reopen();
  EXPECT_FALSE(std::filesystem::exists(dir / ".partial-123-0"));
  auto upload = store_->GetUpload("m", 7);
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  EXPECT_EQ(upload->received, std::vector<uint32_t>{1});
  EXPECT_EQ(upload->created_at_ms, 1764600000000);
  ASSERT_TRUE(PushShard("m", 7, 0, 3, shards[0]).ok());
  auto last = PushShard("m", 7, 2, 3, shards[2]);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_TRUE(last->version);
  ExpectGlobalTensors(Parse(*Restore("m", 7)));
  // The layout document of format 1, as stored in the version's header.
  auto layout = store_->GetShardLayout("m", 7);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(
      *layout,
      R"({"format":1,"shard_sha256":[")" + Sha256Hex(shards[0]) + R"(",")" + Sha256Hex(shards[1]) +
          R"(",")" + Sha256Hex(shards[2]) +
          R"("],"shards":3,"tensors":{"norm":{"dtype":"F32","global_shape":[40],"slices":[)"
          R"({"offsets":[0],"shape":[40],"shard":0},{"offsets":[0],"shape":[40],"shard":1},)"
          R"({"offsets":[0],"shape":[40],"shard":2}]},"step":{"dtype":"I64","global_shape":[],)"
          R"("slices":[{"offsets":[],"shape":[],"shard":1}]},"wo":{"dtype":"F32",)"
          R"("global_shape":[40,9],"slices":[{"offsets":[0,0],"shape":[40,3],"shard":0},)"
          R"({"offsets":[0,3],"shape":[40,3],"shard":1},{"offsets":[0,6],"shape":[40,3],)"
          R"("shard":2}]},"wq":{"dtype":"F32","global_shape":[9,40],"slices":[{"offsets":)"
          R"([0,0],"shape":[4,40],"shard":0},{"offsets":[4,0],"shape":[3,40],"shard":1},)"
          R"({"offsets":[7,0],"shape":[2,40],"shard":2}]}}})");
}

}  // namespace
}  // namespace ckpt::testing

namespace ckpt::testing {
namespace {

// Shards coded by their ranks (encoded shards): a rank asks for its shard's plan, codes the
// chunks its slice holds whole against its part of the previous version, and sends the rest
// raw; the commit stores exactly what it would have stored for the same shards sent plain.
class EncodedShardTest : public ShardedUploadTest {
 protected:
  // Codes `shard` of `of` of `version` as its rank does, against `reference` (the rank's part
  // of the base: null when it holds none), keeping the rank's reconstruction in `restored`.
  Result<std::string> EncodeShard(std::string_view model, uint64_t version, uint32_t shard,
                                  uint32_t of, const std::string& body,
                                  const std::string* reference, std::string* restored) {
    CKPT_ASSIGN_OR_RETURN(const CheckpointView view, CheckpointView::Parse(Bytes(body)));
    const std::string_view raw_header = view.raw_header();
    CKPT_ASSIGN_OR_RETURN(const CodingPlan plan,
                          store_->PlanShard(model, version, shard, of, raw_header));
    std::optional<CheckpointView> reference_view;
    if (reference != nullptr) {
      CKPT_ASSIGN_OR_RETURN(reference_view, CheckpointView::Parse(Bytes(*reference)));
    }
    std::string encoded;
    std::vector<uint8_t> kept;
    CKPT_RETURN_IF_ERROR(EncodeByPlan(
                             plan, view, reference_view ? &*reference_view : nullptr, 2,
                             [&](std::string_view piece) {
                               encoded += piece;
                               return Status::Ok();
                             },
                             CollectInto(&kept))
                             .status());
    *restored = std::string(kept.begin(), kept.end());
    return encoded;
  }

  // The part of a restored version `base` that a rank holding `spec`'s slices keeps (what it
  // pulls when it re-syncs): the same tensors and slices as its shard.
  static std::string PartOf(const ParsedBody& base, const ShardSpec& spec) {
    std::vector<OwnedTensor> part;
    std::map<std::string, SliceDeclaration> slices;
    for (const auto& [global, box] : spec) {
      const BodyTensor& t = base.tensors.at(global->name);
      part.push_back(
          {global->name, t.dtype, box.shape, Cut({global->name, t.dtype, t.shape, t.bytes}, box)});
      if (box.shape != global->shape) slices[global->name] = {global->shape, box.offsets};
    }
    return Serialize(part, {{std::string(kSlicesMetadataKey), SliceDeclarationsJson(slices)}});
  }

  Result<ShardResult> PushEncodedShard(std::string_view model, uint64_t version, uint32_t shard,
                                       uint32_t of, const std::string& encoded) {
    PushOptions options;
    options.body_format = PushBodyFormat::kEncoded;
    return PushShard(model, version, shard, of, encoded, options);
  }

  // Version `version` of three tensors: `w` split by rows (its cuts inside chunks), `v` by
  // columns, `norm` replicated, `step` on the last shard.
  std::vector<ShardSpec> Shards(uint32_t of) {
    std::vector<ShardSpec> out(of);
    for (uint32_t s = 0; s < of; ++s) {
      auto [row, rows] = SplitExtent(w_.shape[0], s, of);
      auto [column, columns] = SplitExtent(v_.shape[1], s, of);
      out[s] = {
          {&w_, Rows(w_, row, rows)}, {&v_, Columns(v_, column, columns)}, {&norm_, Whole(norm_)}};
    }
    out[of - 1].push_back({&step_, Whole(step_)});
    return out;
  }

  void Drift(uint64_t version) {
    std::mt19937_64 rng(version);
    std::normal_distribution<float> noise(0, 0.01f);
    auto drift = [&](OwnedTensor& t, std::vector<float>& values) {
      for (float& x : values) x += noise(rng);
      t.bytes = FloatBytes(values);
    };
    if (w_values_.empty()) {
      w_values_.assign(70 * 48, 0.5f);
      v_values_.assign(48 * 60, -0.25f);
      norm_values_.assign(40, 1.0f);
      w_ = {"w", DType::kF32, {70, 48}, ""};
      v_ = {"v", DType::kF32, {48, 60}, ""};
      norm_ = {"norm", DType::kF32, {40}, ""};
      step_ = OwnedTensor{"step", DType::kI64, {}, std::string(8, '\0')};
    }
    drift(w_, w_values_);
    drift(v_, v_values_);
    drift(norm_, norm_values_);
    step_.bytes[0] = static_cast<char>(version);
  }

  std::vector<float> w_values_, v_values_, norm_values_;
  OwnedTensor w_, v_;
};

TEST_F(EncodedShardTest, RanksCodeTheirSlicesAndTheStoreIsTheOneTheDaemonCodes) {
  for (const char* model : {"plain", "edge"}) {
    ASSERT_TRUE(
        store_->SetPolicy(model, LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.001})")).ok());
  }
  std::map<uint32_t, std::string> references;  // each rank's part of the last version
  for (uint64_t version = 1; version <= 4; ++version) {
    Drift(version);
    // Versions 3 and 4 change the rank count; in version 3, rank 1 sends its shard plain (a
    // rank without the codec).
    const uint32_t of = version == 3 ? 2 : 3;
    const std::vector<ShardSpec> specs = Shards(of);
    if (version >= 3) {
      // A change of layout: each rank re-syncs its new part of the previous version.
      const ParsedBody base = Parse(*Restore("edge", version - 1));
      references.clear();
      for (uint32_t s = 0; s < of; ++s) references[s] = PartOf(base, specs[s]);
    }
    std::optional<VersionInfo> plain, edge;
    uint64_t sent = 0, raw = 0;
    for (uint32_t s = 0; s < of; ++s) {
      const std::string body = ShardBody(specs[s]);
      raw += body.size();
      auto p = PushShard("plain", version, s, of, body);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      if (p->version) plain = p->version;
      Result<ShardResult> e = Status::Internal("unset");
      if (version == 3 && s == 1) {
        e = PushShard("edge", version, s, of, body);
        sent += body.size();
      } else {
        auto it = references.find(s);
        std::string restored;
        auto encoded = EncodeShard("edge", version, s, of, body,
                                   it == references.end() ? nullptr : &it->second, &restored);
        ASSERT_TRUE(encoded.ok()) << version << "/" << s << ": " << encoded.status().ToString();
        sent += encoded->size();
        e = PushEncodedShard("edge", version, s, of, *encoded);
        references[s] = std::move(restored);
      }
      ASSERT_TRUE(e.ok()) << version << "/" << s << ": " << e.status().ToString();
      if (e->version) edge = e->version;
      // A stored encoded shard is indexed again from the spool after a restart.
      if (version == 2 && s == 0) Reopen();
    }
    ASSERT_TRUE(plain && edge) << version;
    EXPECT_EQ(edge->sha256, plain->sha256) << version;
    EXPECT_EQ(edge->stored_bytes, plain->stored_bytes) << version;
    EXPECT_EQ(*Restore("edge", version), *Restore("plain", version)) << version;
    auto detail = store_->GetVersionDetail("edge", version);
    ASSERT_TRUE(detail.ok());
    for (const TensorDetail& t : detail->tensors) {
      if (version > 1 && t.name != "step") {
        EXPECT_EQ(t.kind, "delta") << version << " " << t.name;
      }
    }
    // `v`, cut by columns, is stored in tiles, one a slice of the rank count its chain began
    // with (version 3's two ranks hold no tile: they send it raw).
    for (const TensorDetail& t : detail->tensors) {
      if (t.name == "v") {
        EXPECT_EQ(t.tiles, (std::vector<uint32_t>{1, 3})) << version;
      }
    }
    // What the ranks sent: the chunks of their rows and of their tiles coded.
    EXPECT_LT(sent, raw) << version;
    if (version != 3) {
      EXPECT_LT(sent * 3, raw * 2) << version;
    }
  }
}

TEST_F(EncodedShardTest, AStalePlanADamagedPayloadAndACutBodyAreRefusedStoringNothing) {
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.001})")).ok());
  Drift(1);
  const std::vector<ShardSpec> specs = Shards(2);
  std::string restored;
  const std::string body = ShardBody(specs[0]);
  auto encoded = EncodeShard("m", 1, 0, 2, body, nullptr, &restored);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();

  // A byte of the last record's payload flipped (the end frame's 129 bytes follow it): its
  // checksum no longer matches.
  std::string damaged = *encoded;
  damaged[damaged.size() - 129 - 5] ^= 0x40;
  auto refused = PushEncodedShard("m", 1, 0, 2, damaged);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();

  // Cut short.
  refused = PushEncodedShard("m", 1, 0, 2, encoded->substr(0, encoded->size() - 10));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);

  // A shard sent as another shard's index is another shard: its plan names other slices.
  refused = PushEncodedShard("m", 1, 1, 2, *encoded);
  ASSERT_FALSE(refused.ok());

  // The policy changed since the plan: the plan is stale.
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.002})")).ok());
  refused = PushEncodedShard("m", 1, 0, 2, *encoded);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().subcode(), StatusSubcode::kStalePlan) << refused.status().ToString();
  auto upload = store_->GetUpload("m", 1);
  EXPECT_TRUE(!upload.ok() || upload->received.empty());
  EXPECT_FALSE(store_->GetVersion("m", 1).ok());
}

TEST_F(EncodedShardTest, AShardCodedByAPlanTheCommitNoLongerMakesIsDroppedForItsRankToResend) {
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.001})")).ok());
  Drift(1);
  const std::vector<ShardSpec> specs = Shards(2);
  std::string restored;
  auto encoded = EncodeShard("m", 1, 0, 2, ShardBody(specs[0]), nullptr, &restored);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  ASSERT_TRUE(PushEncodedShard("m", 1, 0, 2, *encoded).ok());

  // While version 1's upload is in progress, a shard of version 2 gets no plan: version 1's
  // commit will be its base.
  auto early = store_->PlanShard("m", 2, 0, 2,
                                 CheckpointView::Parse(Bytes(ShardBody(specs[0])))->raw_header());
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().subcode(), StatusSubcode::kStalePlan) << early.status().ToString();

  // So does an upload of version 0 of a model without versions.
  ASSERT_TRUE(PushShard("z", 0, 0, 2, ShardBody(specs[0])).ok());
  early = store_->PlanShard("z", 3, 0, 2,
                            CheckpointView::Parse(Bytes(ShardBody(specs[0])))->raw_header());
  EXPECT_EQ(early.status().subcode(), StatusSubcode::kStalePlan) << early.status().ToString();

  // The policy changes before the last shard: the commit refuses the encoded shard and drops it.
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.002})")).ok());
  // The plain shard that completed the upload stays: its sender is told the others were dropped.
  auto last = PushShard("m", 1, 1, 2, ShardBody(specs[1]));
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().subcode(), StatusSubcode::kShardsDropped) << last.status().ToString();
  EXPECT_NE(last.status().message().find("shards 0 "), std::string::npos)
      << last.status().message();
  auto upload = store_->GetUpload("m", 1);
  ASSERT_TRUE(upload.ok());
  EXPECT_EQ(upload->received, std::vector<uint32_t>{1});

  // Its rank codes it again by the new plan: the version commits.
  encoded = EncodeShard("m", 1, 0, 2, ShardBody(specs[0]), nullptr, &restored);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  auto committed = PushEncodedShard("m", 1, 0, 2, *encoded);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  ASSERT_TRUE(committed->version);
  const ParsedBody body = Parse(*Restore("m", 1));
  EXPECT_EQ(body.tensors.at("step").bytes, step_.bytes);
}

// The slices of a tensor that cut it along different dimensions: the rank whose slice cuts its
// columns only plans them in tiles, the version does not. The commit says so (no new plan would
// differ), and the shard sent again plain commits.
TEST_F(EncodedShardTest, AShardPlannedInTilesTheVersionDoesNotUseIsRefusedPlainly) {
  const OwnedTensor x = Global("x", {32, 48}, 0.5f);
  const std::vector<ShardSpec> specs = {{{&x, Columns(x, 0, 16)}},
                                        {{&x, TensorBox{{0, 16}, {16, 32}}}},
                                        {{&x, TensorBox{{16, 16}, {16, 32}}}}};
  std::string restored;
  auto encoded = EncodeShard("m", 1, 0, 3, ShardBody(specs[0]), nullptr, &restored);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  ASSERT_TRUE(PushEncodedShard("m", 1, 0, 3, *encoded).ok());
  ASSERT_TRUE(PushShard("m", 1, 1, 3, ShardBody(specs[1])).ok());
  auto last = PushShard("m", 1, 2, 3, ShardBody(specs[2]));
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().code(), StatusCode::kInvalidArgument) << last.status().ToString();
  EXPECT_NE(last.status().subcode(), StatusSubcode::kStalePlan);
  EXPECT_NE(last.status().message().find("send the coded shards plain"), std::string::npos);
  auto again = PushShard("m", 1, 0, 3, ShardBody(specs[0]));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(again->version);
  EXPECT_TRUE(Parse(*Restore("m", 1)).tensors.at("x").bytes == x.bytes);
}

TEST_F(EncodedShardTest, ARankWhoseReferenceDriftedHasItsShardDroppedAndNamed) {
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.001})")).ok());
  Drift(1);
  std::vector<ShardSpec> specs = Shards(2);
  std::string kept;
  for (uint32_t s = 0; s < 2; ++s) {
    auto encoded = EncodeShard("m", 1, s, 2, ShardBody(specs[s]), nullptr, &kept);
    ASSERT_TRUE(encoded.ok());
    ASSERT_TRUE(PushEncodedShard("m", 1, s, 2, *encoded).ok());
  }
  Drift(2);
  specs = Shards(2);
  // A reference far from version 1's reconstruction (here: version 2 itself). One within the
  // bound of it is harmless: a lattice delta restores to the same point from either.
  const std::string wrong = ShardBody(specs[0]);
  std::string drifted_kept, good_kept;
  auto drifted = EncodeShard("m", 2, 0, 2, ShardBody(specs[0]), &wrong, &drifted_kept);
  ASSERT_TRUE(drifted.ok()) << drifted.status().ToString();
  ASSERT_TRUE(PushEncodedShard("m", 2, 0, 2, *drifted).ok());  // checked by its structure
  // The rank whose shard completed the upload is told that another rank's shard was dropped
  // (its own stays: it has nothing to send again), not that its reference drifted.
  auto last = PushShard("m", 2, 1, 2, ShardBody(specs[1]));
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(last.status().subcode(), StatusSubcode::kShardsDropped);
  EXPECT_NE(last.status().message().find("shard 0 of version 2"), std::string::npos)
      << last.status().message();
  EXPECT_FALSE(store_->GetVersion("m", 2).ok());
  EXPECT_EQ(store_->GetUpload("m", 2)->received, std::vector<uint32_t>{1});

  // Rank 0 pulls its part of version 1 (here: cut from a restore) and sends its shard again.
  const std::string reference = PartOf(Parse(*Restore("m", 1)), specs[0]);
  auto good = EncodeShard("m", 2, 0, 2, ShardBody(specs[0]), &reference, &good_kept);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  auto committed = PushEncodedShard("m", 2, 0, 2, *good);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_TRUE(committed->version);

  // A drifted shard that completes the upload is its own rank's to send again.
  Drift(3);
  specs = Shards(2);
  ASSERT_TRUE(PushShard("m", 3, 1, 2, ShardBody(specs[1])).ok());
  const std::string wrong3 = ShardBody(specs[0]);
  auto drifted_last = EncodeShard("m", 3, 0, 2, ShardBody(specs[0]), &wrong3, &drifted_kept);
  ASSERT_TRUE(drifted_last.ok()) << drifted_last.status().ToString();
  auto refused = PushEncodedShard("m", 3, 0, 2, *drifted_last);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().subcode(), StatusSubcode::kReferenceDrifted)
      << refused.status().ToString();
  EXPECT_EQ(store_->GetUpload("m", 3)->received, std::vector<uint32_t>{1});
}

TEST_F(EncodedShardTest, ARestoredShardedVersionPushedWholeEncodedFollowsItsPlan) {
  // A restored sharded version carries its layout: a whole push of it is planned as sharded,
  // by the plan endpoint as by the push.
  ASSERT_TRUE(
      store_->SetPolicy("m", LossyPolicy(R"({"mode": "lossy", "max_abs_error": 0.001})")).ok());
  Drift(1);
  const std::vector<ShardSpec> specs = Shards(2);
  for (uint32_t s = 0; s < 2; ++s) ASSERT_TRUE(PushShard("m", 1, s, 2, ShardBody(specs[s])).ok());
  const std::string v1 = *Restore("m", 1);
  auto view = CheckpointView::Parse(Bytes(v1));
  ASSERT_TRUE(view.ok());
  auto plan = store_->PlanPush("m", 2, view->raw_header());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::string body;
  auto coded = EncodeByPlan(*plan, *view, &*view, 1, [&](std::string_view piece) {
    body += piece;
    return Status::Ok();
  });
  ASSERT_TRUE(coded.ok()) << coded.status().ToString();
  PushOptions options;
  options.body_format = PushBodyFormat::kEncoded;
  auto session = store_->BeginPush("m", 2, body.size(), options);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->Write(Bytes(body)).ok());
  auto info = (*session)->Commit();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  auto detail = store_->GetVersionDetail("m", 2);
  for (const TensorDetail& t : detail->tensors) {
    if (t.name != "step") {
      EXPECT_EQ(t.kind, "delta") << t.name;
    }
  }
}

}  // namespace
}  // namespace ckpt::testing
