// The whole-store passes the admin endpoints and the offline commands share.
#include "ckpt/storage/maintenance_service.h"

#include <gtest/gtest.h>

#include "store_fixture.h"

namespace ckpt {
namespace {

using testing::CheckpointStoreTest;
using testing::DriftingModel;

class MaintenanceServiceTest : public CheckpointStoreTest {};

// Every model's retention runs; a model held by a push is reported (ABORTED) and skipped, and
// the totals count only what was done.
TEST_F(MaintenanceServiceTest, CollectAllAppliesEveryPolicyAndSkipsBusyModels) {
  DriftingModel drift(1, 2000);
  for (const char* model : {"a", "b"}) {
    for (uint64_t v = 1; v <= 4; ++v) ASSERT_TRUE(Push(model, v, drift.Next()).ok());
    auto policy = RetentionPolicy::FromJson(R"({"keep_last":2})");
    ASSERT_TRUE(policy.ok());
    ASSERT_TRUE(store_->SetRetentionPolicy(model, *policy).ok());
  }
  auto held = store_->BeginPush("b", 5, std::nullopt);  // holds b's lock
  ASSERT_TRUE(held.ok());
  MaintenanceService service(store_.get());
  auto pass = service.CollectAll(std::chrono::milliseconds(0));
  ASSERT_TRUE(pass.ok()) << pass.status().ToString();
  ASSERT_EQ(pass->models.size(), 2u);
  EXPECT_EQ(pass->models[0].name, "a");
  ASSERT_TRUE(pass->models[0].status.ok());
  EXPECT_EQ(pass->models[0].report.deleted, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(pass->models[1].name, "b");
  EXPECT_EQ(pass->models[1].status.code(), StatusCode::kAborted);
  EXPECT_EQ(pass->failures(), 1u);
  EXPECT_EQ(pass->deleted_versions, 2u);
  EXPECT_EQ(pass->bytes_freed, pass->models[0].report.gc.bytes_freed);
  held->reset();
  auto versions = store_->ListVersions("b");
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->size(), 4u);  // untouched
}

TEST_F(MaintenanceServiceTest, ScrubAllReportsEveryModel) {
  DriftingModel drift(2, 2000);
  for (const char* model : {"x", "y", "z"}) ASSERT_TRUE(Push(model, 1, drift.Next()).ok());
  auto pass = MaintenanceService(store_.get()).ScrubAll();
  ASSERT_TRUE(pass.ok()) << pass.status().ToString();
  ASSERT_EQ(pass->models.size(), 3u);
  EXPECT_TRUE(pass->clean());
  for (const ScrubReport& r : pass->models) EXPECT_EQ(r.versions_checked, 1u) << r.model;
}

}  // namespace
}  // namespace ckpt
