// FromRocks: a RocksDB status as a Status, at the edge of the storage part. Internal to storage/.
#pragma once

#include <rocksdb/status.h>

#include <string>
#include <string_view>

#include "ckpt/codec/status.h"

namespace ckpt {

// IoError, DataLoss for corruption, NotFound; `what` names the operation.
inline Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) return Status::DataLoss(std::move(msg));
  return Status::IoError(std::move(msg));
}

}  // namespace ckpt
