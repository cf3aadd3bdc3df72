// Version metadata, tags and retention passes of the store.
#include <gtest/gtest.h>

#include <set>

#include "store_fixture.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::Bytes;
using testing::CheckpointStoreTest;
using testing::DriftingModel;
using testing::Sha256Hex;

class LifecycleTest : public CheckpointStoreTest {
 protected:
  Result<VersionInfo> PushWith(uint64_t version, std::string_view body,
                               const PushOptions& options) {
    CKPT_ASSIGN_OR_RETURN(auto session, store_->BeginPush("m", version, body.size(), options));
    CKPT_RETURN_IF_ERROR(session->Write(Bytes(body)));
    return session->Commit();
  }

  std::set<uint64_t> Versions() {
    std::set<uint64_t> out;
    auto versions = store_->ListVersions("m");
    EXPECT_TRUE(versions.ok()) << versions.status().ToString();
    if (!versions.ok()) return out;
    for (const auto& v : versions.value()) out.insert(v.version);
    return out;
  }
};

TEST_F(LifecycleTest, MetricsAndLabelsComeFromMetadataAndOptionsWhichWin) {
  std::vector<testing::OwnedTensor> tensors = {{"w", DType::kF32, {2}, std::string(8, '\0')}};
  const std::string body = testing::Serialize(tensors, {{"metric.loss", "1.5"},
                                                        {"metric.acc", "0.9"},
                                                        {"metric.note", "not a number"},
                                                        {"label.run", "a1"},
                                                        {"other", "x"}});
  PushOptions options;
  options.metrics["acc"] = 0.95;
  options.labels["host"] = "n7";
  auto info = PushWith(10, body, options);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const std::map<std::string, double> metrics = {{"acc", 0.95}, {"loss", 1.5}};
  const std::map<std::string, std::string> labels = {{"host", "n7"}, {"run", "a1"}};
  EXPECT_EQ(info->metrics, metrics);
  Reopen();
  auto stored = store_->GetVersion("m", 10);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->metrics, metrics);
  EXPECT_EQ(stored->labels, labels);
}

TEST_F(LifecycleTest, BadPushOptionsAreRejectedBeforeAnythingIsStored) {
  PushOptions bad_tag;
  bad_tag.tags = {"no spaces"};
  EXPECT_EQ(store_->BeginPush("m", 1, std::nullopt, bad_tag).status().code(),
            StatusCode::kInvalidArgument);
  PushOptions bad_metric;
  bad_metric.metrics["loss"] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(store_->BeginPush("m", 1, std::nullopt, bad_metric).status().code(),
            StatusCode::kInvalidArgument);
  PushOptions long_label;
  long_label.labels["x"] = std::string(2000, 'a');
  EXPECT_EQ(store_->BeginPush("m", 1, std::nullopt, long_label).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetModel("m").status().code(), StatusCode::kNotFound);
}

TEST_F(LifecycleTest, TagsAreUniquePerModelMoveAndPinTheirVersion) {
  DriftingModel drift(41, 1000);
  PushOptions best;
  best.tags = {"best"};
  ASSERT_TRUE(PushWith(1, drift.Next(), best).ok());
  auto second = PushWith(2, drift.Next(), best);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->tags, std::vector<std::string>{"best"});
  EXPECT_EQ(*store_->ResolveTag("m", "best"), 2u);
  EXPECT_TRUE(store_->GetVersion("m", 1)->tags.empty());

  ASSERT_TRUE(store_->SetTag("m", "release", 1).ok());
  EXPECT_EQ(store_->GetVersion("m", 1)->tags, std::vector<std::string>{"release"});
  EXPECT_EQ(store_->SetTag("m", "release", 99).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->SetTag("m", "bad tag", 1).code(), StatusCode::kInvalidArgument);
  // A tagged version is pinned: deleting it needs the tag removed first.
  EXPECT_EQ(store_->DeleteVersion("m", 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->RemoveTag("m", "release").ok());
  EXPECT_EQ(store_->RemoveTag("m", "release").code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->ResolveTag("m", "release").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->DeleteVersion("m", 1).ok());
  EXPECT_EQ(store_->ResolveTag("nope", "best").status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(store_->DeleteModel("m").ok());
  ASSERT_TRUE(Push("m", 1, drift.Next()).ok());
  EXPECT_EQ(store_->ResolveTag("m", "best").status().code(), StatusCode::kNotFound);
}

TEST_F(LifecycleTest, RetentionKeepsTheUnionOfItsRulesTagsAndLatestAndRestoresAreUnchanged) {
  DriftingModel drift(42, 3000);
  std::map<uint64_t, std::string> sha;
  const double loss[] = {9, 8, 2, 7, 6, 5, 4, 3, 3.5, 3.2, 3.1, 3.3};
  for (uint64_t v = 1; v <= 12; ++v) {
    PushOptions options;
    options.metrics["loss"] = loss[v - 1];
    auto info = PushWith(v * 100, drift.Next(), options);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    sha[v * 100] = info->sha256;
  }
  ASSERT_TRUE(store_->SetTag("m", "release", 200).ok());
  auto policy = RetentionPolicy::FromJson(
      R"({"keep_last":2,"keep_every":500,"keep_best":{"count":1,"metric":"loss"}})");
  ASSERT_TRUE(policy.ok());
  ASSERT_TRUE(store_->SetRetentionPolicy("m", *policy).ok());
  Reopen();
  EXPECT_EQ(*store_->GetRetentionPolicy("m"), *policy);

  const std::set<uint64_t> expected = {200, 300, 500, 1000, 1100, 1200};
  RetentionRun preview;
  preview.dry_run = true;
  auto dry = store_->ApplyRetention("m", preview);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(dry->deleted, (std::vector<uint64_t>{100, 400, 600, 700, 800, 900}));
  EXPECT_EQ(Versions().size(), 12u);  // a dry run deletes nothing

  auto applied = store_->ApplyRetention("m", RetentionRun{});
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(applied->deleted, dry->deleted);
  EXPECT_GT(applied->gc.bytes_freed, 0u);
  EXPECT_EQ(Versions(), expected);
  for (uint64_t v : expected) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(Sha256Hex(*body), sha[v]) << v;
  }
  // A policy given with the run is previewed without being stored.
  RetentionRun other;
  other.dry_run = true;
  other.policy = *RetentionPolicy::FromJson(R"({"keep_last":1})");
  auto keep_last = store_->ApplyRetention("m", other);
  ASSERT_TRUE(keep_last.ok());
  EXPECT_EQ(keep_last->deleted, (std::vector<uint64_t>{300, 500, 1000, 1100}));
  EXPECT_EQ(*store_->GetRetentionPolicy("m"), *policy);
}

TEST_F(LifecycleTest, ServerDefaultRetentionAppliesToModelsWithoutOne) {
  store_.reset();
  StoreOptions options;
  options.data_dir = dir_.str();
  options.default_retention = *RetentionPolicy::FromJson(R"({"keep_last":3})");
  testing::ApplyTestStoreBackend(options);
  store_ = std::move(CheckpointStore::Open(options)).value();
  DriftingModel drift(43, 1000);
  for (uint64_t v = 1; v <= 5; ++v) ASSERT_TRUE(Push("m", v, drift.Next()).ok());
  EXPECT_EQ(*store_->GetRetentionPolicy("m"), options.default_retention);
  ASSERT_TRUE(store_->ApplyRetention("m", RetentionRun{}).ok());
  EXPECT_EQ(Versions(), (std::set<uint64_t>{3, 4, 5}));
}

TEST_F(LifecycleTest, BackupRestoresEveryVersionTagAndPolicyIdentically) {
  DriftingModel drift(44, 5000);
  std::map<uint64_t, std::string> sha;
  for (uint64_t v = 1; v <= 6; ++v) sha[v] = Push("m", v, drift.Next())->sha256;
  ASSERT_TRUE(
      store_->SetPolicy("q", *CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":1e-3})", {}))
          .ok());
  const std::string lossy_body = drift.Next();
  const std::string lossy_sha = Push("q", 1, lossy_body)->sha256;
  ASSERT_TRUE(store_->SetTag("m", "release", 3).ok());
  ASSERT_TRUE(
      store_->SetRetentionPolicy("m", *RetentionPolicy::FromJson(R"({"keep_last":9})")).ok());
  testing::TempDir backups;
  auto backup = store_->Backup(backups.str());
  if (!testing::TestStoreIsLocal()) {
    // The data directory of a shared backend is a cache: the object store is backed up instead.
    EXPECT_EQ(backup.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(backup.status().message().find("the data directory is only a cache"),
              std::string::npos)
        << backup.status().ToString();
    return;
  }
  ASSERT_TRUE(backup.ok()) << backup.status().ToString();
  EXPECT_GT(backup->size_bytes, 0u);
  EXPECT_GT(backup->files, 0u);
  ASSERT_TRUE(Push("m", 7, drift.Next()).ok());  // after the backup: not in it

  testing::TempDir restored_dir;
  const std::string data = restored_dir.str() + "/data";
  ASSERT_TRUE(CheckpointStore::RestoreBackup(backups.str(), data).ok());
  EXPECT_EQ(CheckpointStore::RestoreBackup(backups.str(), data).code(),
            StatusCode::kFailedPrecondition);  // not into a non-empty directory
  EXPECT_EQ(CheckpointStore::RestoreBackup(restored_dir.str() + "/none", data + "2").code(),
            StatusCode::kNotFound);
  StoreOptions options;
  options.data_dir = data;
  auto copy = CheckpointStore::Open(options);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  auto versions = (*copy)->ListVersions("m");
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 6u);
  for (const VersionInfo& v : *versions) {
    auto stream = (*copy)->OpenRestore("m", v.version);
    ASSERT_TRUE(stream.ok());
    std::string body;
    for (;;) {
      auto piece = (*stream)->Next();
      ASSERT_TRUE(piece.ok()) << piece.status().ToString();
      if (piece->empty()) break;
      body.append(reinterpret_cast<const char*>(piece->data()), piece->size());
    }
    EXPECT_EQ(Sha256Hex(body), sha[v.version]) << v.version;
  }
  EXPECT_EQ(*(*copy)->ResolveTag("m", "release"), 3u);
  EXPECT_EQ((*copy)->GetRetentionPolicy("m")->keep_last, 9u);
  EXPECT_EQ((*copy)->GetVersion("q", 1)->sha256, lossy_sha);
  EXPECT_TRUE((*copy)->Scrub("m")->clean());
}

}  // namespace
}  // namespace ckpt
