// UploadExpirer: removes sharded uploads left uncommitted for longer than
// storage.upload_expiry_seconds (CheckpointStore::ExpireUploads), and logs each one.
//
// Owns its thread (a PeriodicThread): it checks every tenth of the expiry, at least once a
// second and at most every minute. `store` must outlive it.
#pragma once

#include <chrono>

#include "ckpt/storage/checkpoint_store.h"
#include "periodic_thread.h"

namespace ckpt::daemon {

class UploadExpirer {
 public:
  UploadExpirer(CheckpointStore* store, std::chrono::seconds expiry);

 private:
  void Expire();

  CheckpointStore* const store_;
  PeriodicThread thread_;  // last: stopped before the members it uses go
};

}  // namespace ckpt::daemon
