// `ckptd copy-store` between a local store and the S3 gateway of the one-node cluster, both
// ways, with the real binary: every version restores bit-identically from the copy, tags and
// policies come along, the stored bytes are the source's, a second run skips what is there, and
// the copy takes pushes that continue its chains.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backends/s3/s3_client.h"
#include "ceph_cluster.h"
#include "store_fixture.h"
#include "store_open.h"
#include "test_support.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CephCluster;

constexpr char kBucket[] = "ckptd-copy-tests";

struct CommandRun {
  int exit_code = -1;
  std::string out;  // standard output (standard error goes to the test's log)
};

CommandRun Ckptd(const std::string& args) {
  CommandRun run;
  FILE* pipe = popen((std::string(CKPTD_BINARY) + " " + args).c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) run.out.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The JSON lines of a copy-store run, by model.
std::map<std::string, json> Lines(const std::string& out) {
  std::map<std::string, json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    json parsed = json::parse(line);
    lines[parsed["model"]] = parsed;
  }
  return lines;
}

// A store on the bucket's copy, with an empty cache in `data_dir`: everything from the bucket.
StoreOptions BucketStore(const std::string& data_dir) {
  StoreOptions options;
  options.data_dir = data_dir;
  options.min_free_bytes = 0;
  options.s3 = S3Options{};
  options.s3->endpoint = CephCluster::Get().Gateway();
  options.s3->bucket = kBucket;
  options.s3->prefix = "t-copy";
  options.s3->access_key = CephCluster::kS3AccessKey;
  options.s3->secret_key = CephCluster::kS3SecretKey;
  return options;
}

Result<std::string> RestoreAll(CheckpointStore& store, const std::string& model, uint64_t v) {
  CKPT_ASSIGN_OR_RETURN(auto stream, store.OpenRestore(model, v));
  return testing::ReadAll(*stream);
}

TEST(CopyStoreTest, ALocalStoreMovesIntoABucketAndBackRestoringEveryVersionIdentically) {
  CKPT_REQUIRE_S3_GATEWAY();
  ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
  testing::TempDir dir;
  const std::string local = dir.str() + "/local", back = dir.str() + "/back";

  // The source: a lossless model with a tag and a lossy one with a retention policy.
  std::map<std::string, std::map<uint64_t, std::string>> restored;  // model -> version -> body
  std::map<std::string, uint64_t> stored_bytes;
  {
    StoreOptions options;
    options.data_dir = local;
    options.chunk_bytes = 16384;
    options.min_free_bytes = 0;
    auto store = CheckpointStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(
        (*store)
            ->SetPolicy("lossy", testing::LossyPolicy(R"({"mode":"lossy","max_abs_error":1e-3})"))
            .ok());
    ASSERT_TRUE((*store)
                    ->SetRetentionPolicy("lossy", *RetentionPolicy::FromJson(R"({"keep_last":10})"))
                    .ok());
    testing::DriftingModel drift(21, 20000);
    for (const char* model : {"exact", "lossy"}) {
      for (uint64_t v = 1; v <= 4; ++v) {
        const std::string body = drift.Next();
        auto session = (*store)->BeginPush(model, v * 100, body.size());
        ASSERT_TRUE(session.ok()) << session.status().ToString();
        ASSERT_TRUE((*session)->Write(testing::Bytes(body)).ok());
        ASSERT_TRUE((*session)->Commit().ok());
        auto body_back = RestoreAll(**store, model, v * 100);
        ASSERT_TRUE(body_back.ok()) << body_back.status().ToString();
        restored[model][v * 100] = *body_back;
      }
      stored_bytes[model] = (*store)->GetModel(model)->stored_bytes;
    }
    ASSERT_TRUE((*store)->SetTag("exact", "best", 200).ok());
  }

  const std::string s3_config = dir.str() + "/s3.toml", back_config = dir.str() + "/back.toml";
  std::ofstream(s3_config) << "[storage]\ndata_dir = \"" << dir.str() << "/s3-cache\"\n"
                           << "[s3]\nendpoint = \"" << CephCluster::Get().Gateway()
                           << "\"\nbucket = \"" << kBucket << "\"\nprefix = \"t-copy\"\n"
                           << "access_key = \"" << CephCluster::kS3AccessKey
                           << "\"\nsecret_key = \"" << CephCluster::kS3SecretKey << "\"\n"
                           << "advertise_url = \"http://127.0.0.1:1\"\n";
  std::ofstream(back_config) << "[storage]\ndata_dir = \"" << back << "\"\n";

  // Every version restores from `store` as it did from the source, with the same stored bytes.
  auto expect_the_source = [&](CheckpointStore& store, const std::string& where) {
    for (const auto& [model, versions] : restored) {
      auto info = store.GetModel(model);
      ASSERT_TRUE(info.ok()) << where << ": " << info.status().ToString();
      EXPECT_EQ(info->version_count, versions.size()) << where;
      EXPECT_EQ(info->stored_bytes, stored_bytes[model]) << where << ", " << model;
      for (const auto& [v, body] : versions) {
        auto copy = RestoreAll(store, model, v);
        ASSERT_TRUE(copy.ok()) << where << ", " << model << " " << v << ": "
                               << copy.status().ToString();
        EXPECT_TRUE(*copy == body) << where << ", " << model << " " << v;
      }
    }
    auto tag = store.ResolveTag("exact", "best");
    ASSERT_TRUE(tag.ok()) << where << ": " << tag.status().ToString();
    EXPECT_EQ(*tag, 200u) << where;
    EXPECT_EQ(store.GetRetentionPolicy("lossy")->ToJson(),
              RetentionPolicy::FromJson(R"({"keep_last":10})")->ToJson())
        << where;
    auto policy = store.GetPolicy("lossy");
    ASSERT_TRUE(policy.ok());
    EXPECT_EQ(policy->ToJson(),
              testing::LossyPolicy(R"({"mode":"lossy","max_abs_error":1e-3})").ToJson())
        << where;
  };

  // Into the bucket.
  CommandRun into = Ckptd("copy-store --data-dir " + local + " --to-config " + s3_config);
  ASSERT_EQ(into.exit_code, 0) << into.out;
  auto lines = Lines(into.out);
  ASSERT_EQ(lines.size(), 2u) << into.out;
  EXPECT_EQ(lines["exact"]["copied"]["versions"], 4) << into.out;
  EXPECT_EQ(lines["lossy"]["copied"]["versions"], 4) << into.out;
  EXPECT_GT(lines["lossy"]["copied"]["chunks"], 0) << into.out;
  // Run again: nothing to do, nothing changed.
  CommandRun again = Ckptd("copy-store --data-dir " + local + " --to-config " + s3_config);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  lines = Lines(again.out);
  EXPECT_TRUE(lines["exact"].contains("skipped")) << again.out;
  EXPECT_TRUE(lines["lossy"].contains("skipped")) << again.out;
  {
    auto store = CheckpointStore::Open(BucketStore(dir.str() + "/reader"));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_NO_FATAL_FAILURE(expect_the_source(**store, "in the bucket"));
    auto scrub = (*store)->Scrub("lossy");
    ASSERT_TRUE(scrub.ok());
    EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks;
  }

  // A missing destination config and an unknown model are refused, naming them.
  CommandRun bad =
      Ckptd("copy-store --data-dir " + local + " --to-config " + dir.str() + "/none.toml");
  EXPECT_NE(bad.exit_code, 0);
  CommandRun unknown =
      Ckptd("copy-store --data-dir " + local + " --to-config " + back_config + " --model nosuch");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.out.find("nosuch"), std::string::npos) << unknown.out;

  // And back to a disk, from the bucket.
  CommandRun out = Ckptd("copy-store --config " + s3_config + " --to-config " + back_config +
                         " --model exact --model lossy");
  ASSERT_EQ(out.exit_code, 0) << out.out;
  StoreOptions options;
  options.data_dir = back;
  options.min_free_bytes = 0;
  auto store = CheckpointStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_NO_FATAL_FAILURE(expect_the_source(**store, "back on a disk"));
  // The copy goes on: the next push deltas against the copied latest.
  testing::DriftingModel drift(21, 20000);
  for (int i = 0; i < 8; ++i) (void)drift.Next();
  const std::string next = drift.Next();
  auto session = (*store)->BeginPush("lossy", 500, next.size());
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ASSERT_TRUE((*session)->Write(testing::Bytes(next)).ok());
  auto pushed = (*session)->Commit();
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_NE(pushed->kind, "keyframe");  // deltas ("delta", or "mixed" beside small tensors)
  auto continued = RestoreAll(**store, "lossy", 500);
  ASSERT_TRUE(continued.ok()) << continued.status().ToString();
  EXPECT_EQ(testing::CheckWithinBound(next, *continued, 1e-3).error, "");

  // The bucket's copy takes pushes too (seqs above every copied one), and restores them.
  auto bucket = CheckpointStore::Open(BucketStore(dir.str() + "/writer"));
  ASSERT_TRUE(bucket.ok()) << bucket.status().ToString();
  auto bucket_session = (*bucket)->BeginPush("exact", 600, next.size());
  ASSERT_TRUE(bucket_session.ok()) << bucket_session.status().ToString();
  ASSERT_TRUE((*bucket_session)->Write(testing::Bytes(next)).ok());
  ASSERT_TRUE((*bucket_session)->Commit().ok());
  auto from_bucket = RestoreAll(**bucket, "exact", 600);
  ASSERT_TRUE(from_bucket.ok()) << from_bucket.status().ToString();
  EXPECT_TRUE(*from_bucket == next);
  for (const auto& [v, body] : restored["exact"]) {
    auto copied = RestoreAll(**bucket, "exact", v);
    ASSERT_TRUE(copied.ok()) << v << ": " << copied.status().ToString();
    EXPECT_TRUE(*copied == body) << v;
  }
}

// Once armed, fails every PUT of a log entry after the first (the writer's claim of the model):
// the store never answers the commit.
class FailCommits : public S3FaultInjector {
 public:
  void Arm() { armed_ = true; }
  S3Fault Next(std::string_view method, std::string_view key, int) override {
    if (!armed_ || method != "PUT" || key.find("/log/") == std::string_view::npos) {
      return S3Fault::kNone;
    }
    return ++log_puts_ > 1 ? S3Fault::kInternalError : S3Fault::kNone;
  }

 private:
  std::atomic<bool> armed_{false};
  std::atomic<int> log_puts_{0};
};

// A copy into a bucket whose commit never landed leaves its packs under the name (the outcome
// was unknown, so they were kept); packs are never written twice, so a rerun copies the model
// beside them and collects them once it committed.
TEST(CopyStoreTest, ACopyIntoABucketCutAtItsCommitRunsAgainAndItsLeftoversGo) {
  CKPT_REQUIRE_S3_GATEWAY();
  ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
  testing::TempDir dir;
  StoreOptions source_options;
  source_options.data_dir = dir.str() + "/local";
  source_options.chunk_bytes = 16384;
  source_options.min_free_bytes = 0;
  auto source = CheckpointStore::Open(source_options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  testing::DriftingModel drift(31, 20000);
  std::map<uint64_t, std::string> bodies;
  for (uint64_t v = 1; v <= 3; ++v) {
    bodies[v] = drift.Next();
    auto session = (*source)->BeginPush("m", v, bodies[v].size());
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    ASSERT_TRUE((*session)->Write(testing::Bytes(bodies[v])).ok());
    ASSERT_TRUE((*session)->Commit().ok());
  }

  StoreOptions bucket = BucketStore(dir.str() + "/cut");
  bucket.s3->prefix = "t-copy-cut";
  bucket.s3->attempts = 1;
  bucket.s3->advertise_url = "http://127.0.0.1:1";
  {
    auto faults = std::make_shared<FailCommits>();
    auto destination = OpenStoreOn(bucket, nullptr, faults);
    ASSERT_TRUE(destination.ok()) << destination.status().ToString();
    faults->Arm();
    auto copied = (*source)->CopyModelTo("m", **destination);
    ASSERT_FALSE(copied.ok());
  }
  S3Client client(*bucket.s3);
  auto listed = client.ListAll("chunks/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  const size_t leftovers = listed->size();
  ASSERT_GT(leftovers, 0u) << "the cut copy's packs";

  bucket.data_dir = dir.str() + "/again";
  auto destination = CheckpointStore::Open(bucket);
  ASSERT_TRUE(destination.ok()) << destination.status().ToString();
  auto copied = (*source)->CopyModelTo("m", **destination);
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  for (const auto& [v, body] : bodies) {
    auto restored = RestoreAll(**destination, "m", v);
    ASSERT_TRUE(restored.ok()) << "version " << v << ": " << restored.status().ToString();
    EXPECT_TRUE(*restored == body) << "version " << v;
  }
  listed = client.ListAll("chunks/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), leftovers) << "the copy's packs replace the cut copy's";
  auto scrub = (*destination)->Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks << " orphaned chunks";
  auto gc = (*destination)->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->orphan_chunks_removed, 0u) << "collected by the copy";
}

}  // namespace
}  // namespace ckpt
