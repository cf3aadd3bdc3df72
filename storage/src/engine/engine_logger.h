// EngineLogger: RocksDB's own log (its warnings and errors), handed to the daemon's log instead
// of a LOG file in the data directory. A log file on the data volume is the first thing a full
// volume breaks, and RocksDB (7.8) aborts the process when it logs again to a file whose write
// failed. Internal to storage/.
//
// Thread safety: safe for concurrent use (RocksDB logs from its background threads); `sink`
// must be too.
#pragma once

#include <rocksdb/env.h>

#include <functional>
#include <memory>
#include <string_view>

namespace ckpt {

// A logger passing each line RocksDB logs at `level` or above to `sink` (null: standard error).
std::shared_ptr<rocksdb::Logger> NewEngineLogger(rocksdb::InfoLogLevel level,
                                                 std::function<void(std::string_view)> sink);

}  // namespace ckpt
