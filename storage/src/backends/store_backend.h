// StoreBackend: where a store's chunk records live and how a change of a model's metadata
// becomes durable. Internal to storage/.
//
// The store always keeps its metadata (models, versions, manifests, codec state, tags) in its
// local RocksDB and reasons about it there. The backend decides what "durable" means:
//   - LocalBackend (the default): chunk records are in RocksDB's chunks family and a change is
//     one synced WriteBatch, after a flush of the large records it refers to (they skip the
//     write-ahead log). Single node; nothing else involved.
//   - the RADOS backend (rados_backend.cc): chunk records are RADOS objects; a change commits
//     first to the model's object in the cluster (one guarded operation, fenced by the model's
//     lease epoch) and then to the local RocksDB, which is a cache of the cluster's metadata that
//     any daemon can rebuild (Refresh). Writes to a model go through the one daemon holding its
//     lease (ClaimWrites).
//
// Thread safety: implementations are safe for concurrent use. Pushes, deletions, policy
// changes and garbage collection of one model are serialized by the store (ModelLocks); a tag
// change may commit beside them, so implementations serialize the commits of one model.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backends/upload_spool.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"
#include "engine/store_schema.h"
#include "records/records.h"

namespace ckpt {

class StoreHealth;

// The chunk records written under one seq: tensor i has chunk_counts[i] chunks. `some_tensors`:
// only those of the tensors with a count (the others of the seq stay), as when garbage
// collection removes the tensors a version dropped.
struct ChunkSet {
  uint64_t seq = 0;
  std::vector<uint32_t> chunk_counts;
  bool some_tensors = false;

  static ChunkSet Of(uint64_t seq, const ManifestRecord& manifest);
};

// One atomic change of one model's metadata, and the chunk records it makes unreachable.
struct ModelChange {
  rocksdb::WriteBatch batch;          // puts and deletes in the metadata families
  std::vector<ChunkSet> unreachable;  // removed with (local) or after (RADOS) the commit
  // The model is deleted: every chunk record of it goes, including ones no manifest lists.
  bool whole_model = false;
  // The change refers to chunk records the caller just wrote (a push, a rebase): the commit
  // waits until they are durable. Only the holder of the model's lock writes chunks.
  bool refers_to_new_chunks = false;
  // Non-zero: the change brings chunk records under seqs below this that the model's epoch does
  // not account for (a model copied from another store keeps its seqs). A shared backend raises
  // the model's epoch above them, so that every seq allocated later — by this writer or one
  // that takes the model over — is above them and no two writers ever pick the same seq.
  uint64_t foreign_seqs_end = 0;
};

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;

  // Chunk records. Names are (model, seq, tensor, chunk); a seq is never reused for other
  // content (SeqFloor), so a record, once written, never changes.
  //
  // A write may complete asynchronously (RADOS keeps several in flight): it is durable once a
  // Commit of a change with refers_to_new_chunks succeeds, which first waits for the model's
  // writes and fails if any did.
  virtual Status PutChunk(const std::string& model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                          std::string_view record) = 0;
  // Whether every chunk object this backend writes has a name never written before (S3's packs
  // are named at random). Objects that work which never committed left under a model's name then
  // never meet new ones: a writer may go ahead beside them and collect them once it committed.
  virtual bool WritesFreshChunkNames() const { return false; }
  // Reads through `ro` (its snapshot, for the local backend). NotFound if absent.
  virtual Status GetChunk(const rocksdb::ReadOptions& ro, const std::string& model, uint64_t seq,
                          uint32_t tensor, uint32_t chunk, rocksdb::PinnableSlice* record) = 0;
  // Reads several records at once (the links of a delta chain; RADOS reads them concurrently).
  // `records` is resized to `addresses`.
  struct ChunkAddress {
    uint64_t seq;
    uint32_t tensor;
    uint32_t chunk;
  };
  // How many records a reader should ask GetChunks for at once: 1 where reads are local (no
  // latency to hide, and every record read ahead is memory), more where each read is a round
  // trip.
  virtual size_t ReadWindow() const { return 1; }
  virtual Status GetChunks(const rocksdb::ReadOptions& ro, const std::string& model,
                           const std::vector<ChunkAddress>& addresses,
                           std::vector<rocksdb::PinnableSlice>* records) {
    *records = std::vector<rocksdb::PinnableSlice>(addresses.size());
    for (size_t i = 0; i < addresses.size(); ++i) {
      const ChunkAddress& a = addresses[i];
      CKPT_RETURN_IF_ERROR(GetChunk(ro, model, a.seq, a.tensor, a.chunk, &(*records)[i]));
    }
    return Status::Ok();
  }
  // Ends the current group of chunk writes of `model`: the records written so far go to files
  // (objects) of their own, apart from those written next (the local backend flushes the chunks
  // family into its blob files; S3 closes the model's pack). A writer that knows its records'
  // lifetimes differ calls it between them, so that a file of records that die together is
  // dropped whole, without copying survivors.
  virtual Status SealChunkWrites(const std::string& /*model*/) { return Status::Ok(); }
  // Makes the chunk records of `model` written so far durable ahead of the commit that refers
  // to them, for a caller that commits under a lock other models' commits wait for (the commit
  // would otherwise do it there). The local backend flushes the records that skipped its
  // write-ahead log.
  virtual Status PersistChunkWrites(const std::string& /*model*/) { return Status::Ok(); }
  // Gives back the space of the chunk records of `model` with seqs in [seq_begin, seq_end) that
  // a commit removed, without moving the records that live on (the local backend compacts that
  // key range, which drops blob files holding only removed records).
  virtual Status ReclaimRemovedChunks(const std::string& /*model*/, uint64_t /*seq_begin*/,
                                      uint64_t /*seq_end*/) {
    return Status::Ok();
  }
  // Removes chunk records no commit refers to (an aborted push, a rebase given up). Best effort:
  // what stays behind is an orphan for garbage collection.
  virtual void DiscardChunks(const std::string& model, const ChunkSet& chunks) = 0;
  // Every stored chunk record of `model` with seq below `seq_end` (scrub), but those whose
  // removal is already scheduled (shared backends defer removals for readers in flight).
  using ChunkVisitor =
      std::function<void(uint64_t seq, uint32_t tensor, uint32_t chunk, std::string_view record)>;
  virtual Status ForEachChunk(const rocksdb::ReadOptions& ro, const std::string& model,
                              uint64_t seq_end, const ChunkVisitor& visit) = 0;

  // Removes the chunk records of `model` with seq below `seq_end` that belong to no stored push
  // (`stored`: the seqs of every stored manifest), left by pushes a crash or a lost lease
  // interrupted; returns how many. The local backend removes those at open (0 here).
  virtual Result<uint64_t> RemoveOrphanChunks(const std::string& model,
                                              const std::set<uint64_t>& stored,
                                              uint64_t seq_end) = 0;

  // Makes `change` durable and visible, then removes its unreachable chunks. `what` names the
  // operation in errors. The caller holds the model's lock (tag changes: the tags mutex).
  virtual Status Commit(const std::string& model, ModelChange& change, std::string_view what) = 0;

  // Scale-out hooks; the local backend has nothing to do.
  //
  // Before reading `model`: bring the local metadata up to date (a no-op when it is).
  virtual Status Refresh(const std::string& model) = 0;
  // Refresh of many models at once (listings).
  virtual Status RefreshMany(const std::vector<std::string>& models) {
    for (const std::string& model : models) CKPT_RETURN_IF_ERROR(Refresh(model));
    return Status::Ok();
  }
  // Before changing `model` (under its lock): Ok if this daemon may write it (it holds or just
  // took the model's lease); Unavailable naming the owner otherwise.
  virtual Status ClaimWrites(const std::string& model) = 0;
  // Where writes to `model` must go: nullopt when this daemon may take them (it holds the lease,
  // or nobody does), else the owner's advertised URL.
  virtual Result<std::optional<std::string>> WriteOwner(const std::string& model) = 0;
  // The lowest seq a new push or rebase of `model` may use (0: no floor). Seqs above it were
  // never used by any daemon, so records written under them cannot collide with a former
  // owner's.
  virtual uint64_t SeqFloor(const std::string& model) = 0;
  // Every model's name (nullopt: the local models family is authoritative).
  virtual Result<std::optional<std::vector<std::string>>> ListModelNames() = 0;
  // Where the shards of sharded uploads are kept until they commit: files under `local_root`
  // (beside the database) unless the backend keeps them where every daemon of its cluster reads
  // them, so that any daemon takes a shard and the model's writer commits it.
  virtual Result<std::unique_ptr<UploadSpool>> NewUploadSpool(const std::string& local_root) {
    return NewLocalUploadSpool(local_root);
  }
  // Adds the backend's figures (cluster: leases) to `stats`.
  virtual void AddStats(StoreStats*) {}
  // Whether the data is in this daemon's RocksDB alone (backups, compaction, recovery apply).
  virtual bool IsLocal() const = 0;
  // Where a shared backend keeps the data, for messages ("the Ceph pool 'ckptd' (namespace
  // 'team-a')"); "" for the local one.
  virtual std::string Location() const { return ""; }
};

// The default backend: chunk records in `chunks`, commits as synced (per `sync`) write batches.
// `health` (which outlives it) says whether the engine has failed since it opened.
std::unique_ptr<StoreBackend> NewLocalBackend(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks,
                                              StoreHealth* health, bool sync);

}  // namespace ckpt
