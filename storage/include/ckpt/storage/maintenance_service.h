// MaintenanceService: the whole-store maintenance passes — retention and garbage collection of
// every model, a scrub of every model, a backup — over a CheckpointStore. The admin endpoints
// (POST /v1/admin/gc|scrub|backup) run them on a live daemon and `ckptd gc|scrub|backup` run them
// offline, so both do the same work and report it the same way.
//
// Thread safety: as safe as the store it works on (CheckpointStore is safe for concurrent use).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt {

// What a garbage-collection pass did to each model.
struct GcPassReport {
  struct Model {
    std::string name;
    Status status;           // not OK: the model was skipped (e.g. busy beyond the wait)
    RetentionReport report;  // when status is OK
  };
  std::vector<Model> models;  // in the store's model order
  uint64_t deleted_versions = 0;
  uint64_t bytes_freed = 0;      // stored bytes of the data this pass removed
  uint64_t bytes_reclaimed = 0;  // of data earlier passes removed, taken off the volume now

  size_t failures() const;
};

// What a scrub pass found in each model.
struct ScrubPassReport {
  std::vector<ScrubReport> models;  // models deleted during the pass are left out
  bool clean() const;
};

class MaintenanceService {
 public:
  // `store` must outlive the service.
  explicit MaintenanceService(CheckpointStore* store) : store_(store) {}

  // Applies every model's retention policy and reclaims the space, waiting up to `lock_wait`
  // for a model busy with a push; a model that still fails is reported and skipped.
  Result<GcPassReport> CollectAll(std::chrono::milliseconds lock_wait);

  // Scrubs every model (CheckpointStore::Scrub); the first error other than a model deleted
  // meanwhile ends the pass.
  Result<ScrubPassReport> ScrubAll();

  // CheckpointStore::Backup.
  Result<BackupResult> Backup(const std::string& backup_dir) { return store_->Backup(backup_dir); }

 private:
  CheckpointStore* const store_;
};

}  // namespace ckpt
