// The sharded-version routes through the socket-free handler: shard pushes (202, 201, 200),
// the upload's state, commit and abort, the layout, and restore selections in the query.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckpt/api/api_handler.h"
#include "ckpt/base/tensor_slices.h"
#include "test_support.h"

namespace ckpt::api {
namespace {

using nlohmann::json;
using testing::FloatBytes;
using testing::Serialize;
using testing::TempDir;

TEST(ShardRouting, ClassifiesShardAndUploadRoutes) {
  const Route shard = ClassifyTarget("/v1/models/r/versions/7/shards/3?of=4");
  EXPECT_EQ(shard.kind, RouteKind::kShard);
  EXPECT_EQ(shard.version, "7");
  EXPECT_EQ(shard.shard, "3");
  EXPECT_EQ(PlanOf("PUT", shard), RequestPlan::kPush);
  EXPECT_EQ(ClassifyTarget("/v1/models/r/versions/7/shards").kind, RouteKind::kUpload);
  EXPECT_EQ(ClassifyTarget("/v1/models/r/versions/7/shards:commit").kind, RouteKind::kUploadCommit);
  const Route layout = ClassifyTarget("/v1/models/r/versions/7?layout=1");
  EXPECT_TRUE(layout.layout);
  EXPECT_EQ(PlanOf("GET", layout), RequestPlan::kSimple);
  EXPECT_EQ(PlanOf("GET", ClassifyTarget("/v1/models/r/versions/7?rank=0&of=2")),
            RequestPlan::kRestore);
}

TEST(ShardRouting, ParsesRestoreSelections) {
  auto s = ParseRestoreQuery("tensors=layers.*.w,emb&tensors=head&rank=1&of=4");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tensors, (std::vector<std::string>{"layers.*.w", "emb", "head"}));
  EXPECT_EQ(s->rank, 1u);
  EXPECT_EQ(s->ranks, 4u);
  auto box = ParseRestoreQuery("tensor=w&offsets=0,128&shape=64,128");
  ASSERT_TRUE(box.ok());
  EXPECT_EQ(box->box->first, "w");
  EXPECT_EQ(box->box->second.offsets, (std::vector<uint64_t>{0, 128}));
  EXPECT_TRUE(ParseRestoreQuery("")->whole());
  EXPECT_TRUE(ParseRestoreQuery("detail=0")->whole());
  for (const char* bad :
       {"rank=1", "rank=2&of=2", "of=0&rank=0", "tensor=w&offsets=1", "tensor=w&offsets=a&shape=1",
        "tensor=w&offsets=0&shape=1&rank=0&of=2", "colour=red"}) {
    EXPECT_EQ(ParseRestoreQuery(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto shard = ParseShardQuery("of=4&metric.loss=0.5&tag=best");
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->first, 4u);
  EXPECT_EQ(shard->second.metrics.at("loss"), 0.5);
  EXPECT_EQ(ParseShardQuery("metric.loss=1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseShardQuery("of=x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseShardQuery("of=2&colour=red").status().code(), StatusCode::kInvalidArgument);
}

TEST(ShardRouting, ParsesSingleByteRanges) {
  using R = std::optional<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(ParseByteRange("bytes=0-9", 100), (R{{0, 9}}));
  EXPECT_EQ(ParseByteRange("bytes=90-", 100), (R{{90, 99}}));
  EXPECT_EQ(ParseByteRange("bytes=-10", 100), (R{{90, 99}}));
  EXPECT_EQ(ParseByteRange("bytes=-1000", 100), (R{{0, 99}}));
  EXPECT_EQ(ParseByteRange("bytes=50-5000", 100), (R{{50, 99}}));
  const R past = ParseByteRange("bytes=100-", 100);
  ASSERT_TRUE(past);
  EXPECT_GT(past->first, past->second);  // unsatisfiable: 416
  for (const char* ignored :
       {"bytes=9-0", "bytes=0-9,20-29", "items=0-9", "bytes=-0", "bytes=x-", "bytes=", ""}) {
    EXPECT_EQ(ParseByteRange(ignored, 100), std::nullopt) << ignored;
  }
}

class ShardRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.data_dir = dir_.str();
    options.min_free_bytes = 0;
    store_ = std::move(CheckpointStore::Open(options)).value();
    handler_ = std::make_unique<ApiHandler>(store_.get(),
                                            [this](const std::string&) { ++committed_hooks_; });
  }

  ApiResponse Call(std::string_view method, std::string_view target) {
    return handler_->Handle(method, ClassifyTarget(target), {});
  }

  ApiResponse PutShard(std::string_view target, const std::string& body) {
    auto push = handler_->BeginPush(ClassifyTarget(target), body.size());
    if (!push.ok()) return ApiHandler::ErrorResponse(push.status());
    Status s = (*push)->Write(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
    if (!s.ok()) return ApiHandler::ErrorResponse(s);
    return handler_->FinishPush(**push);
  }

  // Rank `rank` of 2's rows of a [4, 3] matrix.
  static std::string Half(uint32_t rank, float base = 0) {
    std::vector<float> rows(6);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = base + rank * 6 + static_cast<float>(i);
    std::map<std::string, SliceDeclaration> slices = {{"w", {{4, 3}, {2ull * rank, 0}}}};
    return Serialize({{"w", DType::kF32, {2, 3}, FloatBytes(rows)}},
                     {{std::string(kSlicesMetadataKey), SliceDeclarationsJson(slices)}});
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<ApiHandler> handler_;
  int committed_hooks_ = 0;
};

TEST_F(ShardRoutesTest, ShardsAreAcceptedThenCommittedThenAnsweredAgain) {
  ApiResponse first = PutShard("/v1/models/m/versions/5/shards/1?of=2", Half(1));
  ASSERT_EQ(first.status, 202) << first.body;
  json upload = json::parse(first.body)["upload"];
  EXPECT_EQ(upload["received"], json::array({1}));
  EXPECT_EQ(upload["missing"], json::array({0}));
  EXPECT_FALSE(upload["committed"].get<bool>());
  EXPECT_TRUE(upload.contains("expires_at"));

  ApiResponse page = Call("GET", "/");
  EXPECT_NE(page.body.find("Sharded uploads in progress"), std::string::npos);
  EXPECT_NE(page.body.find("1 of 2"), std::string::npos);
  ApiResponse state = Call("GET", "/v1/models/m/versions/5/shards");
  ASSERT_EQ(state.status, 200);
  EXPECT_EQ(json::parse(state.body)["shard_count"], 2);
  ApiResponse early = Call("POST", "/v1/models/m/versions/5/shards:commit");
  EXPECT_EQ(early.status, 409) << early.body;
  EXPECT_NE(early.body.find("misses 1 of its 2 shards (0)"), std::string::npos) << early.body;
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/latest?detail=1").status, 404);

  ApiResponse last = PutShard("/v1/models/m/versions/5/shards/0?of=2&tag=best", Half(0));
  ASSERT_EQ(last.status, 201) << last.body;
  const json committed = json::parse(last.body);
  EXPECT_EQ(committed["version"]["version"], 5);
  EXPECT_EQ(committed["version"]["tags"], json::array({"best"}));
  EXPECT_TRUE(committed["upload"]["committed"].get<bool>());
  EXPECT_EQ(committed_hooks_, 1);
  EXPECT_EQ(Call("GET", "/").body.find("Sharded uploads in progress"), std::string::npos);

  ApiResponse again = PutShard("/v1/models/m/versions/5/shards/1?of=2", Half(1));
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(committed_hooks_, 1);
  EXPECT_EQ(PutShard("/v1/models/m/versions/5/shards/1?of=2", Half(1, 9)).status, 409);

  ApiResponse layout = Call("GET", "/v1/models/m/versions/5?layout=1");
  ASSERT_EQ(layout.status, 200) << layout.body;
  const json l = json::parse(layout.body);
  EXPECT_EQ(l["shards"], 2);
  EXPECT_EQ(l["tensors"]["w"]["global_shape"], json::array({4, 3}));
  EXPECT_EQ(l["tensors"]["w"]["slices"].size(), 2u);
}

TEST_F(ShardRoutesTest, BadShardRequestsAreClearErrors) {
  auto expect = [&](std::string_view target, const std::string& body, int status,
                    std::string_view words) {
    ApiResponse r = PutShard(target, body);
    EXPECT_EQ(r.status, status) << target << ": " << r.body;
    EXPECT_NE(r.body.find(words), std::string::npos) << r.body;
  };
  expect("/v1/models/m/versions/5/shards/0", Half(0), 400, "needs the shard count");
  expect("/v1/models/m/versions/5/shards/x?of=2", Half(0), 400, "shard index 'x'");
  expect("/v1/models/m/versions/5/shards/2?of=2", Half(0), 400, "out of range");
  expect("/v1/models/m/versions/5/shards/0?of=0", Half(0), 400, "shards");
  expect("/v1/models/m/versions/latest/shards/0?of=2", Half(0), 400, "'latest' cannot be pushed");
  ASSERT_EQ(PutShard("/v1/models/m/versions/5/shards/0?of=2", Half(0)).status, 202);
  expect("/v1/models/m/versions/5/shards/1?of=3", Half(1), 400, "has 2 shards, not 3");
  // Rank 1 claiming rank 0's rows.
  expect("/v1/models/m/versions/5/shards/1?of=2", Half(0), 400, "overlapping slices");
  EXPECT_EQ(Call("DELETE", "/v1/models/m/versions/5/shards").status, 204);
  EXPECT_EQ(Call("DELETE", "/v1/models/m/versions/5/shards").status, 404);
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/5/shards").status, 404);
  EXPECT_EQ(Call("PUT", "/v1/models/m/versions/5/shards").status, 405);
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/5/shards:commit").status, 405);
  EXPECT_EQ(committed_hooks_, 0);
}

TEST_F(ShardRoutesTest, ARankRestoreHasNoDigestHeaders) {
  ASSERT_EQ(PutShard("/v1/models/m/versions/5/shards/0?of=2", Half(0)).status, 202);
  ASSERT_EQ(PutShard("/v1/models/m/versions/5/shards/1?of=2", Half(1)).status, 201);
  auto whole = handler_->OpenRestore(ClassifyTarget("/v1/models/m/versions/5"));
  ASSERT_TRUE(whole.ok());
  bool has_digest = false;
  for (const auto& [k, v] : ApiHandler::RestoreHeaders((*whole)->info())) {
    has_digest |= k == "X-Ckpt-Sha256";
  }
  EXPECT_TRUE(has_digest);
  auto part = handler_->OpenRestore(ClassifyTarget("/v1/models/m/versions/5?rank=1&of=2"));
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  for (const auto& [k, v] : ApiHandler::RestoreHeaders((*part)->info())) {
    EXPECT_NE(k, "X-Ckpt-Sha256");
    EXPECT_NE(k, "ETag");
  }
  EXPECT_EQ(
      handler_->OpenRestore(ClassifyTarget("/v1/models/m/versions/5?rank=2&of=2")).status().code(),
      StatusCode::kInvalidArgument);
}

TEST_F(ShardRoutesTest, TheHuggingFaceViewListsFilesOfAtMostTheGivenSize) {
  const std::string a = FloatBytes(std::vector<float>(100, 1)), b = FloatBytes({2, 3}),
                    c = FloatBytes(std::vector<float>(60, 4));
  const std::string body = Serialize(
      {{"a", DType::kF32, {100}, a}, {"b", DType::kF32, {2}, b}, {"c", DType::kF32, {60}, c}});
  auto push = handler_->BeginPush(ClassifyTarget("/v1/models/m/versions/3"), body.size());
  ASSERT_TRUE(push.ok());
  ASSERT_TRUE((*push)
                  ->Write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()),
                                                   body.size()))
                  .ok());
  ASSERT_EQ(handler_->FinishPush(**push).status, 201);
  // 408 bytes at most: [a, b] (400 + 8), then [c].
  ApiResponse index = Call(
      "GET", "/v1/models/m/versions/latest/hf/model.safetensors.index.json?max_shard_bytes=408");
  ASSERT_EQ(index.status, 200) << index.body;
  const json doc = json::parse(index.body);
  EXPECT_EQ(doc["metadata"]["total_size"], 648);
  EXPECT_EQ(doc["weight_map"]["a"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(doc["weight_map"]["b"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(doc["weight_map"]["c"], "model-00002-of-00002.safetensors");
  auto read_all = [&](std::string_view target) -> std::string {
    auto stream = handler_->OpenRestore(ClassifyTarget(target));
    EXPECT_TRUE(stream.ok()) << stream.status().ToString();
    if (!stream.ok()) return "";
    std::string out;
    for (auto piece = (*stream)->Next(); piece.ok() && !piece->empty(); piece = (*stream)->Next()) {
      out.append(reinterpret_cast<const char*>(piece->data()), piece->size());
    }
    return out;
  };
  const std::string first =
      read_all("/v1/models/m/versions/3/hf/model-00001-of-00002.safetensors?max_shard_bytes=408");
  EXPECT_TRUE(first == Serialize({{"a", DType::kF32, {100}, a}, {"b", DType::kF32, {2}, b}}));
  const std::string second =
      read_all("/v1/models/m/versions/3/hf/model-00002-of-00002.safetensors?max_shard_bytes=408");
  EXPECT_TRUE(second == Serialize({{"c", DType::kF32, {60}, c}}));
  // The default size: one file.
  EXPECT_EQ(json::parse(Call("GET", "/v1/models/m/versions/3/hf/model.safetensors.index.json")
                            .body)["weight_map"]["c"],
            "model-00001-of-00001.safetensors");
  EXPECT_EQ(handler_
                ->OpenRestore(
                    ClassifyTarget("/v1/models/m/versions/3/hf/model-00003-of-00002.safetensors"))
                .status()
                .code(),
            StatusCode::kNotFound);
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/3/hf/other.json").status, 404);
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/3/hf/model.safetensors.index.json?max_shard_bytes=0")
                .status,
            400);
  EXPECT_EQ(PlanOf("GET", ClassifyTarget("/v1/models/m/versions/3/hf/x")), RequestPlan::kRestore);
}

}  // namespace
}  // namespace ckpt::api
