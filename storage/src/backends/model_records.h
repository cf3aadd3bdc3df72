// ModelRecords: the metadata records of one model (its model record, versions, manifests, codec
// state and tags) as one flat map from record key to value, the form a shared backend stores
// them in (a RADOS object's omap, an S3 snapshot), and back into the local RocksDB cache.
// Internal to storage/. Written to shared stores: record keys never change.
//
// A record key is a family letter ('m' models, 'v' versions, 'f' manifests, 's' codec state,
// 't' tags) plus the record's key within the model. Keys starting with kControlKeyPrefix are the
// backend's own (epoch, generation, layout) and never records.
//
// Thread safety: thread-safe (immutable after construction).
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ckpt/base/status.h"
#include "engine/store_schema.h"

namespace ckpt {

using RecordMap = std::map<std::string, std::string>;

inline constexpr char kControlKeyPrefix = '\x01';

class ModelRecords {
 public:
  // `db` and `families` are the local cache; they outlive this object.
  ModelRecords(rocksdb::DB* db, const MetadataFamilies& families);

  // The record changes of a change of the model's records. DeleteRange is expanded over the
  // keys the local cache holds (current while this daemon owns the model).
  Status Translate(const std::string& model, const rocksdb::WriteBatch& batch, RecordMap* sets,
                   std::set<std::string>* removals) const;

  // A batch replacing the local cache of `model` by the records `all` (control keys skipped).
  Status CacheBatch(const std::string& model, const RecordMap& all,
                    rocksdb::WriteBatch* batch) const;
  // A batch applying record changes (as Translate made them) to the local cache of `model`.
  Status ChangeBatch(const std::string& model, const RecordMap& sets,
                     const std::set<std::string>& removals, rocksdb::WriteBatch* batch) const;
  // Every record of `model` in the local cache.
  Result<RecordMap> CachedRecords(const std::string& model) const;

 private:
  rocksdb::ColumnFamilyHandle* FamilyOf(uint32_t cf) const;
  // The family of a record key and the record's key in it.
  Result<std::pair<rocksdb::ColumnFamilyHandle*, std::string>> LocalKey(
      const std::string& model, std::string_view record_key) const;
  // Family letter + the key within the model: "" for the records keyed by the model name alone
  // (models, codec_state), the rest after "<model>\0" for the others.
  Result<std::string> RecordKey(const std::string& model, uint32_t cf, std::string_view key) const;

  rocksdb::DB* const db_;
  const MetadataFamilies families_;
  std::unordered_map<uint32_t, char> letters_;
};

}  // namespace ckpt
