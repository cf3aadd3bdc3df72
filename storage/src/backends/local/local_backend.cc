// The single-node backend: chunk records in RocksDB's chunks family, beside the metadata.
#include "backends/store_backend.h"
#include "engine/rocks_status.h"
#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

namespace {

class LocalBackend final : public StoreBackend {
 public:
  LocalBackend(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks, bool sync)
      : db_(db), chunks_(chunks), sync_(sync) {}

  Status PutChunk(const std::string& model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                  std::string_view record) override {
    return FromRocks(db_->Put(rocksdb::WriteOptions(), chunks_,
                              keys::ChunkKey(model, seq, tensor, chunk), record),
                     "writing chunk");
  }

  Status GetChunk(const rocksdb::ReadOptions& ro, const std::string& model, uint64_t seq,
                  uint32_t tensor, uint32_t chunk, rocksdb::PinnableSlice* record) override {
    return FromRocks(db_->Get(ro, chunks_, keys::ChunkKey(model, seq, tensor, chunk), record),
                     "reading chunk");
  }

  // Not synced: if the process dies first, recovery at the next open removes the records.
  void DiscardChunks(const std::string& model, const ChunkSet& chunks) override {
    db_->DeleteRange(rocksdb::WriteOptions(), chunks_, keys::ChunkSeqBegin(model, chunks.seq),
                     keys::ChunkSeqBegin(model, chunks.seq + 1))
        .PermitUncheckedError();
  }

  // Waits for the flush: a flush left running in the background could still be failing when
  // the store resumes the engine after an error, and RocksDB (7.8) can then wait forever.
  Status SealChunkWrites(const std::string&) override {
    rocksdb::FlushOptions flush;
    flush.allow_write_stall = true;
    return FromRocks(db_->Flush(flush, chunks_), "flushing chunk records");
  }

  Status ReclaimRemovedChunks(const std::string& model, uint64_t seq_begin,
                              uint64_t seq_end) override {
    rocksdb::CompactRangeOptions cro;
    cro.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
    cro.exclusive_manual_compaction = false;
    cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    const std::string begin = keys::ChunkSeqBegin(model, seq_begin);
    const std::string end = keys::ChunkSeqBegin(model, seq_end);
    const rocksdb::Slice begin_slice(begin), end_slice(end);
    return FromRocks(db_->CompactRange(cro, chunks_, &begin_slice, &end_slice),
                     "compacting removed chunk records");
  }

  Status ForEachChunk(const rocksdb::ReadOptions& ro, const std::string& model, uint64_t seq_end,
                      const ChunkVisitor& visit) override {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, chunks_));
    const std::string end = keys::ChunkSeqBegin(model, seq_end);
    for (it->Seek(keys::ModelPrefix(model)); it->Valid() && it->key().compare(end) < 0;
         it->Next()) {
      const std::string_view key = it->key().ToStringView();
      const size_t at = model.size() + 1;
      visit(keys::ReadBigEndian(key, at, 8),
            static_cast<uint32_t>(keys::ReadBigEndian(key, at + 8, 4)),
            static_cast<uint32_t>(keys::ReadBigEndian(key, at + 12, 4)),
            it->value().ToStringView());
    }
    return FromRocks(it->status(), "reading chunk records");
  }

  Result<uint64_t> RemoveOrphanChunks(const std::string&, const std::set<uint64_t>&,
                                      uint64_t) override {
    return uint64_t{0};
  }

  Status Commit(const std::string& model, ModelChange& change, std::string_view what) override {
    if (change.whole_model) {
      change.batch.DeleteRange(chunks_, keys::ModelPrefix(model), keys::ModelPrefixEnd(model));
    }
    for (const ChunkSet& set : change.unreachable) {
      if (change.whole_model) break;
      if (!set.some_tensors) {
        change.batch.DeleteRange(chunks_, keys::ChunkSeqBegin(model, set.seq),
                                 keys::ChunkSeqBegin(model, set.seq + 1));
        continue;
      }
      for (uint32_t t = 0; t < set.chunk_counts.size(); ++t) {
        if (set.chunk_counts[t] == 0) continue;
        change.batch.DeleteRange(chunks_, keys::ChunkKey(model, set.seq, t, 0),
                                 keys::ChunkKey(model, set.seq, t + 1, 0));
      }
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync_;
    return FromRocks(db_->Write(wo, &change.batch), what);
  }

  Status Refresh(const std::string&) override { return Status::Ok(); }
  Status ClaimWrites(const std::string&) override { return Status::Ok(); }
  Result<std::optional<std::string>> WriteOwner(const std::string&) override {
    return std::optional<std::string>();
  }
  uint64_t SeqFloor(const std::string&) override { return 0; }
  Result<std::optional<std::vector<std::string>>> ListModelNames() override {
    return std::optional<std::vector<std::string>>();
  }
  bool IsLocal() const override { return true; }

 private:
  rocksdb::DB* const db_;
  rocksdb::ColumnFamilyHandle* const chunks_;
  const bool sync_;
};

}  // namespace

std::unique_ptr<StoreBackend> NewLocalBackend(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks,
                                              bool sync) {
  return std::make_unique<LocalBackend>(db, chunks, sync);
}

}  // namespace ckpt
