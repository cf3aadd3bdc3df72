// The single-node backend: chunk records in RocksDB's chunks family, beside the metadata.
#include <map>
#include <mutex>
#include <set>

#include "backends/store_backend.h"
#include "engine/rocks_status.h"
#include "engine/store_health.h"
#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

namespace {

class LocalBackend final : public StoreBackend {
 public:
  LocalBackend(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks, StoreHealth* health, bool sync)
      : db_(db), chunks_(chunks), health_(health), sync_(sync) {}

  // A large record skips the write-ahead log: the flush before the commit that refers to it
  // writes it once, into a blob file, where logging it would write (and checksum) it twice.
  // Until that commit nothing refers to it, so losing it in a crash loses nothing. Only while
  // the engine has reported no error since it opened: after a failed flush and its
  // resumption, RocksDB 7.8 can report an unlogged put and the flush after it as done and
  // still lose the record (docs/decisions.md).
  Status PutChunk(const std::string& model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                  std::string_view record) override {
    rocksdb::WriteOptions wo;
    wo.disableWAL = record.size() >= kUnloggedRecordBytes && health_->EngineErrors() == 0;
    CKPT_RETURN_IF_ERROR(FromRocks(
        db_->Put(wo, chunks_, keys::ChunkKey(model, seq, tensor, chunk), record), "writing chunk"));
    if (wo.disableWAL) {
      std::lock_guard lock(unlogged_mu_);
      unlogged_[model][seq] += record.size();
      health_->AddUnloggedBytes(record.size());
    }
    return Status::Ok();
  }

  Status GetChunk(const rocksdb::ReadOptions& ro, const std::string& model, uint64_t seq,
                  uint32_t tensor, uint32_t chunk, rocksdb::PinnableSlice* record) override {
    return FromRocks(db_->Get(ro, chunks_, keys::ChunkKey(model, seq, tensor, chunk), record),
                     "reading chunk");
  }

  // Not synced: if the process dies first, recovery at the next open removes the records.
  void DiscardChunks(const std::string& model, const ChunkSet& chunks) override {
    {  // the whole seq goes, whatever `chunks` lists
      std::lock_guard lock(unlogged_mu_);
      auto it = unlogged_.find(model);
      if (it != unlogged_.end()) {
        if (auto seq = it->second.find(chunks.seq); seq != it->second.end()) {
          health_->RemoveUnloggedBytes(seq->second);
          it->second.erase(seq);
        }
        if (it->second.empty()) unlogged_.erase(it);
      }
    }
    RemoveSeq(model, chunks.seq);
  }

  // The records stay marked when the engine failed since they were written: the commit that
  // refers to them is then refused.
  Status SealChunkWrites(const std::string& model) override {
    UnloggedSeqs unlogged = TakeUnlogged(model);
    Status flushed = FlushChunks();
    if (!flushed.ok() || health_->EngineErrors() != 0) {
      GiveBackUnlogged(model, unlogged);
    } else {
      Written(unlogged);
    }
    return flushed;
  }

  // An error of the engine since the records were written, during the flush or before it,
  // keeps them marked: the commit that refers to them is refused and removes them.
  Status PersistChunkWrites(const std::string& model) override {
    UnloggedSeqs unlogged = TakeUnlogged(model);
    if (unlogged.empty()) return Status::Ok();
    Status flushed = FlushUnlogged();
    if (!flushed.ok()) {
      GiveBackUnlogged(model, unlogged);
    } else {
      Written(unlogged);
    }
    return flushed;
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
    // The records the change refers to that skipped the log become durable first. They were
    // written while the engine had no error (PutChunk); one before the flush is done leaves it
    // untrustworthy, and the change is refused and its records removed: its writer may try
    // again, logging every record. (Only the holder of the model's lock writes chunk records,
    // under seqs no commit refers to yet, so the model's unlogged records are this change's, or
    // ones a failed writer left behind.)
    if (change.refers_to_new_chunks) {
      const UnloggedSeqs unlogged = TakeUnlogged(model);
      if (!unlogged.empty()) {
        Status flushed = FlushUnlogged();
        Written(unlogged);  // on the volume, or given up
        if (!flushed.ok()) {
          for (const auto& [seq, bytes] : unlogged) RemoveSeq(model, seq);
          return flushed;
        }
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
  // Records from this size on go to blob files (storage's min_blob_size is below it), and a
  // version holding one is sealed by a flush right after its commit anyway (push_session.cc):
  // the flush before the commit takes its place.
  static constexpr size_t kUnloggedRecordBytes = 64 << 10;
  using UnloggedSeqs = std::map<uint64_t, uint64_t>;  // seq -> bytes of its unlogged records

  // Waits for the flush: a flush left running in the background could still be failing when
  // the store resumes the engine after an error, and RocksDB (7.8) can then wait forever.
  Status FlushChunks() {
    rocksdb::FlushOptions flush;
    flush.allow_write_stall = true;
    return FromRocks(db_->Flush(flush, chunks_), "flushing chunk records");
  }

  // Flushes the records written without the log: Unavailable if the engine reported an error
  // since they were written (before the flush or during it), which leaves them untrustworthy.
  Status FlushUnlogged() {
    const Status failed = Status::Unavailable(
        "the storage engine failed while the records of this change were being written: send it "
        "again");
    if (health_->EngineErrors() != 0) return failed;
    CKPT_RETURN_IF_ERROR(FlushChunks());
    return health_->EngineErrors() != 0 ? failed : Status::Ok();
  }

  // Removes the chunk records of `seq` of `model`, unsynced (if the process dies first,
  // recovery at the next open removes them).
  void RemoveSeq(const std::string& model, uint64_t seq) {
    db_->DeleteRange(rocksdb::WriteOptions(), chunks_, keys::ChunkSeqBegin(model, seq),
                     keys::ChunkSeqBegin(model, seq + 1))
        .PermitUncheckedError();
  }

  // The seqs under which `model` wrote records the log does not hold, forgotten; their bytes
  // stay spoken for until the caller gives them back or calls Written.
  UnloggedSeqs TakeUnlogged(const std::string& model) {
    std::lock_guard lock(unlogged_mu_);
    auto node = unlogged_.extract(model);
    return node.empty() ? UnloggedSeqs() : std::move(node.mapped());
  }
  void GiveBackUnlogged(const std::string& model, const UnloggedSeqs& seqs) {
    if (seqs.empty()) return;
    std::lock_guard lock(unlogged_mu_);
    for (const auto& [seq, bytes] : seqs) unlogged_[model][seq] += bytes;
  }
  // The records of `seqs` are on the volume (flushed) or gone (removed).
  void Written(const UnloggedSeqs& seqs) {
    for (const auto& [seq, bytes] : seqs) health_->RemoveUnloggedBytes(bytes);
  }

  rocksdb::DB* const db_;
  rocksdb::ColumnFamilyHandle* const chunks_;
  StoreHealth* const health_;
  const bool sync_;
  std::mutex unlogged_mu_;
  // By model, the seqs of records written without the log that no commit made durable yet (a
  // writer that gives a seq up discards it), with their bytes (also in StoreHealth's count).
  // Guarded by unlogged_mu_.
  std::map<std::string, UnloggedSeqs> unlogged_;
};

}  // namespace

std::unique_ptr<StoreBackend> NewLocalBackend(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks,
                                              StoreHealth* health, bool sync) {
  return std::make_unique<LocalBackend>(db, chunks, health, sync);
}

}  // namespace ckpt
