// The scale-out backend: chunk records and all metadata in a Ceph RADOS pool shared by several
// daemons; the local RocksDB holds a cache of the metadata. Layout and protocol: docs/design.md
// ("Scale-out on Ceph RADOS").
//
//   model.<name>   one object per model. Its omap holds every metadata record of the model
//                  (family letter + the key within the model) plus two control keys: the lease
//                  epoch and the commit generation. Its exclusive lock "owner" is the lease.
//   models         the index: one omap key per model name.
//   chunk/<name>/<seq>/<tensor>/<chunk>
//                  one immutable object per chunk record (seq in hex, 16 digits).
//   uploads, upload/...
//                  sharded uploads in progress (rados_upload_spool.h).
//
// A commit is one ObjectWriteOperation on the model object: omap_cmp(epoch == ours, generation
// == the one our cache reflects), then the record changes and generation + 1. A daemon that lost
// the lease (paused, partitioned) cannot commit: the new owner bumped the epoch when it took
// over. Seqs are allocated above epoch << 40, so chunk records of a fenced owner's unfinished push
// never share a name with the new owner's.
#include "backends/rados/rados_backend.h"

#include <rocksdb/write_batch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <rados/librados.hpp>
#include <set>
#include <thread>

#include "backends/deferred_removals.h"
#include "backends/rados/metadata_sync.h"
#include "backends/rados/model_leases.h"
#include "backends/rados/rados_chunk_store.h"
#include "backends/rados/rados_layout.h"
#include "backends/rados/rados_status.h"
#include "backends/rados/rados_upload_spool.h"
#include "engine/rocks_status.h"

namespace ckpt {
namespace {

using namespace rados_layout;

// Thread safety: safe for concurrent use (StoreBackend's contract).
class RadosBackend final : public StoreBackend {
 public:
  RadosBackend(rocksdb::DB* db, const MetadataFamilies& families, const ClusterOptions& options)
      : db_(db),
        options_(options),
        layout_(db, families),
        leases_(&io_, options.lease, options.advertise_url),
        sync_(&io_, db, &layout_, &leases_) {}

  ~RadosBackend() override {
    {
      std::lock_guard lock(background_mu_);
      stopping_ = true;
    }
    background_cv_.notify_all();
    if (background_.joinable()) background_.join();
    // Removals still deferred are left: other daemons may be reading those chunks, and the next
    // garbage collection of each model removes them as orphans. Leases are released so that
    // another daemon can take the models over at once.
    leases_.ReleaseAll();
    chunks_.reset();
    io_.close();
    cluster_.shutdown();
  }

  Status Connect() {
    RadosChunkStoreOptions where;
    where.conf_file = options_.conf_file;
    where.client_name = options_.client_name;
    where.pool = options_.pool;
    where.object_namespace = options_.object_namespace;
    CKPT_RETURN_IF_ERROR(ConnectToPool(where, &cluster_, &io_));
    chunks_ = NewRadosChunkStore(io_);
    background_ = std::thread([this] { BackgroundLoop(); });
    return Status::Ok();
  }

  // ---- chunk records

  // Asynchronous: a model's writes queue (ModelState::writes); Commit and DiscardChunks wait for
  // them.
  Status PutChunk(const std::string& model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                  std::string_view record) override {
    const std::string name = ChunkObject(model, seq, tensor, chunk);
    return leases_.StateOf(model).writes.Add(name, [&] { return chunks_->PutAsync(name, record); });
  }

  size_t ReadWindow() const override { return 8; }

  // In the pool: any daemon takes a shard, the model's writer commits the upload.
  Result<std::unique_ptr<UploadSpool>> NewUploadSpool(const std::string&) override {
    return NewRadosUploadSpool(io_);
  }

  Status GetChunks(const rocksdb::ReadOptions&, const std::string& model,
                   const std::vector<ChunkAddress>& addresses,
                   std::vector<rocksdb::PinnableSlice>* records) override {
    std::vector<std::string> names;
    for (const ChunkAddress& a : addresses) {
      names.push_back(ChunkObject(model, a.seq, a.tensor, a.chunk));
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> bytes, chunks_->GetAll(names));
    PinRecords(std::move(bytes), records);
    return Status::Ok();
  }

  Status GetChunk(const rocksdb::ReadOptions&, const std::string& model, uint64_t seq,
                  uint32_t tensor, uint32_t chunk, rocksdb::PinnableSlice* record) override {
    CKPT_ASSIGN_OR_RETURN(*record->GetSelf(), chunks_->Get(ChunkObject(model, seq, tensor, chunk)));
    record->PinSelf();
    return Status::Ok();
  }

  // Best effort: what is left is an orphan for garbage collection.
  void DiscardChunks(const std::string& model, const ChunkSet& chunks) override {
    (void)leases_.StateOf(model).writes.WaitAll();
    (void)chunks_->DeleteAll(ChunkNames(model, chunks));
  }

  Status ForEachChunk(const rocksdb::ReadOptions&, const std::string& model, uint64_t seq_end,
                      const ChunkVisitor& visit) override {
    CKPT_ASSIGN_OR_RETURN(auto listed, ListChunkObjects(model));
    return VisitListedChunks(*chunks_, listed, seq_end, removals_.Pending(), visit);
  }

  Result<uint64_t> RemoveOrphanChunks(const std::string& model, const std::set<uint64_t>& stored,
                                      uint64_t seq_end) override {
    CKPT_ASSIGN_OR_RETURN(auto listed, ListChunkObjects(model));
    // Chunks whose removal is deferred for readers are left to the deferral.
    return RemoveListedOrphans(*chunks_, listed, stored, seq_end, removals_.Pending());
  }

  // ---- metadata

  Status Commit(const std::string& model, ModelChange& change, std::string_view what) override {
    ModelState& state = leases_.StateOf(model);
    // Every chunk the change refers to is durable before the commit makes it visible. (Other
    // changes, a tag say, leave the writes of a push in progress to that push.)
    if (change.refers_to_new_chunks) {
      CKPT_RETURN_IF_ERROR(
          state.writes.WaitAll().WithContext("model '" + model + "': " + std::string(what)));
    }
    std::lock_guard lock(state.mu);
    if (!state.owned || !state.generation) {
      return Status::Unavailable("model '" + model + "': " + std::string(what) +
                                 ": this daemon no longer holds the model's write lease; retry");
    }
    RecordMap records;
    std::set<std::string> removals;
    CKPT_RETURN_IF_ERROR(layout_.Translate(model, change.batch, &records, &removals));
    OmapValues sets = ToOmap(records);
    const uint64_t generation = *state.generation + 1;
    uint64_t epoch = state.epoch;
    sets[kGenerationKey] = U64(generation);
    if (change.whole_model) sets[kEpochKey] = U64(++epoch);  // seqs of a new model start higher
    if (change.foreign_seqs_end > 0) {
      const uint64_t above = ((change.foreign_seqs_end - 1) >> kSeqEpochShift) + 1;
      if (above > epoch) sets[kEpochKey] = U64(epoch = above);
    }
    if (!state.indexed && sets.count("m")) CKPT_RETURN_IF_ERROR(AddIndexEntry(model, state));
    librados::ObjectWriteOperation op;
    int guard = 0;
    op.omap_cmp({{kEpochKey, {U64(state.epoch), LIBRADOS_CMPXATTR_OP_EQ}},
                 {kGenerationKey, {U64(*state.generation), LIBRADOS_CMPXATTR_OP_EQ}}},
                &guard);
    if (!removals.empty()) op.omap_rm_keys(removals);
    op.omap_set(sets);
    const int r = io_.operate(ModelObject(model), &op);
    if (r == -ECANCELED) {
      // Another daemon took the model over (or committed): our view is stale. Nothing applied.
      state.owned = false;
      state.generation.reset();
      commits_fenced_.fetch_add(1, std::memory_order_relaxed);
      return Status::Unavailable("model '" + model + "': " + std::string(what) +
                                 ": refused, another daemon took over the model's write lease; "
                                 "retry (it will be redirected)");
    }
    CKPT_RETURN_IF_ERROR(FromRados(r, "model '" + model + "': " + std::string(what)));
    state.generation = generation;
    state.epoch = epoch;
    // The local cache follows; if this fails the next claim or refresh rebuilds it.
    Status local = FromRocks(db_->Write(rocksdb::WriteOptions(), &change.batch), what);
    if (!local.ok()) state.generation.reset();
    if (change.whole_model) RemoveIndexEntry(model, state);
    std::vector<std::string> unreachable;
    for (const ChunkSet& set : change.unreachable) {
      auto names = ChunkNames(model, set);
      unreachable.insert(unreachable.end(), names.begin(), names.end());
    }
    removals_.Defer(std::move(unreachable), RemovalGrace(options_.lease));
    return Status::Ok();
  }

  Status Refresh(const std::string& model) override { return sync_.Refresh(model); }

  Status RefreshMany(const std::vector<std::string>& models) override {
    return sync_.RefreshMany(models);
  }

  Status ClaimWrites(const std::string& model) override {
    ModelState& state = leases_.StateOf(model);
    std::lock_guard lock(state.mu);
    if (state.HoldsLease()) {
      // Our cache missed a commit's local apply: rebuild it before writing on top of it.
      if (!state.generation) return sync_.Resync(model, state);
      return Status::Ok();
    }
    const std::string oid = ModelObject(model);
    const int r = leases_.Lock(model, state);
    if (r == -EBUSY || r == -EEXIST) {
      state.owned = false;
      CKPT_ASSIGN_OR_RETURN(auto owner, leases_.Holder(model));
      return Status::Unavailable("model '" + model + "' is written through another ckptd daemon" +
                                 (owner ? " (" + *owner + ")" : std::string()) +
                                 "; send writes there");
    }
    CKPT_RETURN_IF_ERROR(FromRados(r, "taking the write lease of model '" + model + "'"));
    if (state.owned) return Status::Ok();  // renewed in time: nobody else can have committed
    // Takeover: fence every former owner by bumping the epoch, then rebuild the cache from what
    // the cluster holds after the bump (commits of a former owner land before it or never).
    OmapValues control;
    int prval = 0;
    librados::ObjectReadOperation read;
    read.omap_get_vals_by_keys({kEpochKey, kGenerationKey, kLayoutKey}, &control, &prval);
    CKPT_RETURN_IF_ERROR(
        FromRados(io_.operate(oid, &read, nullptr), "reading model '" + model + "'"));
    CKPT_ASSIGN_OR_RETURN(const uint64_t epoch, ReadU64(control, kEpochKey));
    CKPT_RETURN_IF_ERROR(CheckLayout(model, control));
    librados::ObjectWriteOperation bump;
    int guard = 0;
    if (control.count(kEpochKey)) {
      bump.omap_cmp({{kEpochKey, {U64(epoch), LIBRADOS_CMPXATTR_OP_EQ}}}, &guard);
    } else {
      bump.omap_set({{kGenerationKey, U64(0)}});
    }
    bump.omap_set({{kEpochKey, U64(epoch + 1)}, {kLayoutKey, U64(kLayoutVersion)}});
    CKPT_RETURN_IF_ERROR(
        FromRados(io_.operate(oid, &bump), "taking over model '" + model + "' (epoch)"));
    CKPT_RETURN_IF_ERROR(AddIndexEntry(model, state));
    state.epoch = epoch + 1;
    state.generation.reset();
    CKPT_RETURN_IF_ERROR(sync_.Resync(model, state));
    state.owned = true;
    lease_takeovers_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  Result<std::optional<std::string>> WriteOwner(const std::string& model) override {
    {
      ModelState& state = leases_.StateOf(model);
      std::lock_guard lock(state.mu);
      if (state.HoldsLease()) return std::optional<std::string>();
    }
    return leases_.Holder(model);
  }

  uint64_t SeqFloor(const std::string& model) override {
    ModelState& state = leases_.StateOf(model);
    std::lock_guard lock(state.mu);
    return state.epoch << kSeqEpochShift;
  }

  Result<std::optional<std::vector<std::string>>> ListModelNames() override {
    std::vector<std::string> names;
    std::string after;
    for (bool more = true; more;) {
      std::set<std::string> page;
      int prval = 0;
      librados::ObjectReadOperation op;
      op.omap_get_keys2(after, kOmapPage, &page, &more, &prval);
      const int r = io_.operate(kIndexObject, &op, nullptr);
      if (r == -ENOENT) break;
      CKPT_RETURN_IF_ERROR(FromRados(r, "listing models"));
      if (page.empty()) break;
      names.insert(names.end(), page.begin(), page.end());
      after = *page.rbegin();
    }
    return std::optional<std::vector<std::string>>(std::move(names));
  }

  bool IsLocal() const override { return false; }
  std::string Location() const override {
    return "the Ceph pool '" + options_.pool + "' (namespace '" + options_.object_namespace + "')";
  }

  void AddStats(StoreStats* stats) override {
    stats->cluster = true;
    stats->lease_takeovers = lease_takeovers_.load(std::memory_order_relaxed);
    stats->leases_lost = leases_.leases_lost();
    stats->commits_fenced = commits_fenced_.load(std::memory_order_relaxed);
    stats->models_owned += leases_.OwnedCount();
  }

 private:
  Result<std::vector<ListedChunk>> ListChunkObjects(const std::string& model) {
    CKPT_ASSIGN_OR_RETURN(auto names, chunks_->List(ChunkPrefix(model)));
    return ParseChunkObjects(model, std::move(names));
  }

  // The index lists a model from before its record is first committed until after it is
  // deleted (a listed name without a record is skipped by listings).
  Status AddIndexEntry(const std::string& model, ModelState& state) {
    librados::ObjectWriteOperation op;
    op.omap_set({{model, librados::bufferlist()}});
    CKPT_RETURN_IF_ERROR(
        FromRados(io_.operate(kIndexObject, &op), "adding model '" + model + "' to the index"));
    state.indexed = true;
    return Status::Ok();
  }

  void RemoveIndexEntry(const std::string& model, ModelState& state) {
    librados::ObjectWriteOperation op;
    op.omap_rm_keys({model});
    io_.operate(kIndexObject, &op);
    state.indexed = false;
  }

  // Renews held leases every third of the lease and runs due deletions.
  void BackgroundLoop() {
    std::unique_lock lock(background_mu_);
    while (!stopping_) {
      background_cv_.wait_for(lock, options_.lease / 3, [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      leases_.RenewAll();
      removals_.RunDue(*chunks_);
      lock.lock();
    }
  }

  rocksdb::DB* const db_;
  const ClusterOptions options_;
  librados::Rados cluster_;
  librados::IoCtx io_;
  std::unique_ptr<ChunkStore> chunks_;  // the chunk objects, on io_'s connection
  const ModelRecords layout_;
  ModelLeases leases_;
  MetadataSync sync_;

  // Monitoring counters (relaxed: figures, never decisions).
  std::atomic<uint64_t> lease_takeovers_{0};
  std::atomic<uint64_t> commits_fenced_{0};

  DeferredRemovals removals_;
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  bool stopping_ = false;  // guarded by background_mu_
  std::thread background_;
};

}  // namespace

Result<std::unique_ptr<StoreBackend>> NewRadosBackend(rocksdb::DB* db,
                                                      const MetadataFamilies& families,
                                                      const ClusterOptions& options) {
  auto backend = std::make_unique<RadosBackend>(db, families, options);
  CKPT_RETURN_IF_ERROR(backend->Connect());
  return std::unique_ptr<StoreBackend>(std::move(backend));
}

}  // namespace ckpt
