// FromRocks: a RocksDB status as a Status, at the edge of the storage part. Internal to storage/.
#pragma once

#include <rocksdb/status.h>

#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt {

// The code names the cause as a client can act on it; the message says it in words that never
// name a server path or a file (RocksDB's own text, which does, is the detail for the log).
// `what` names the operation.
//   no space left          -> ResourceExhausted / NoSpace (HTTP 507)
//   corruption             -> DataLoss
//   not found              -> NotFound
//   busy, try again, shutting down -> Unavailable
//   any other failure      -> IoError
inline Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  const std::string prefix = std::string(what) + ": ";
  Status out;
  if (s.IsNotFound()) {
    out = Status::NotFound(prefix + "not found");
  } else if (s.IsNoSpace()) {
    out = Status::NoSpace(prefix + "no space left on the data volume");
  } else if (s.IsCorruption()) {
    out = Status::DataLoss(prefix + "stored data is corrupt");
  } else if (s.IsShutdownInProgress()) {
    out = Status::Unavailable(prefix + "the store is shutting down");
  } else if (s.IsBusy() || s.IsTryAgain()) {
    out = Status::Unavailable(prefix + "the storage engine is busy; retry");
  } else if (s.IsIOError()) {
    out = Status::IoError(prefix + "the storage engine failed to read or write its files");
  } else {
    out = Status::IoError(prefix + "unexpected storage engine error");
  }
  return out.WithDetail(s.ToString());
}

}  // namespace ckpt
