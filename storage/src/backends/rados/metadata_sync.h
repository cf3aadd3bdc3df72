// MetadataSync: keeps the local RocksDB cache of a model's metadata equal to the records in its
// object in the pool, re-reading the object when its commit generation has moved. Internal to
// storage/.
//
// Thread safety: safe for concurrent use (each model's work is under its ModelState::mu).
#pragma once

#include <rocksdb/db.h>

#include <rados/librados.hpp>
#include <string>
#include <vector>

#include "backends/rados/model_leases.h"
#include "backends/rados/rados_layout.h"
#include "ckpt/base/status.h"

namespace ckpt {

class MetadataSync {
 public:
  // Every pointer outlives the sync.
  MetadataSync(librados::IoCtx* io, rocksdb::DB* db, const ModelRecords* layout,
               ModelLeases* leases)
      : io_(io), db_(db), layout_(layout), leases_(leases) {}

  // Brings the model's cache up to date unless this daemon is its only writer.
  Status Refresh(const std::string& model);
  // The same for many models: their generations are read concurrently (64 in flight), then only
  // the models whose cache is older are re-read.
  Status RefreshMany(const std::vector<std::string>& models);
  // Replaces the local cache of `model` with the cluster's records, reading every page and
  // retrying when a commit lands in between. REQUIRES: state.mu.
  Status Resync(const std::string& model, ModelState& state);

 private:
  librados::IoCtx* const io_;
  rocksdb::DB* const db_;
  const ModelRecords* const layout_;
  ModelLeases* const leases_;
};

}  // namespace ckpt
