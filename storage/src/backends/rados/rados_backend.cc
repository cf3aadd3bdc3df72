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
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <rados/librados.hpp>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "backends/rados/rados_chunk_store.h"
#include "backends/rados/rados_status.h"
#include "core/chain_reader.h"
#include "records/keys.h"

namespace ckpt {
namespace {

namespace keys = storage_keys;
using Clock = std::chrono::steady_clock;

constexpr char kLockName[] = "owner";
constexpr char kIndexObject[] = "models";
// Control keys of a model object start with \001, below every record's family letter.
constexpr char kEpochKey[] = "\001epoch";
constexpr char kGenerationKey[] = "\001generation";
// The layout of a model object (docs/format.md): written at every takeover; a daemon refuses a
// model whose layout is newer than it understands.
constexpr char kLayoutKey[] = "\001layout";
constexpr uint64_t kLayoutVersion = 1;
// Seqs a daemon allocates for a model lie above epoch << kSeqEpochShift.
constexpr int kSeqEpochShift = 40;
// Largest omap page read at once.
constexpr uint64_t kOmapPage = 4096;
// Chunk writes in flight per model (each holds a copy of its record: <= 16 x chunk_bytes).
constexpr size_t kWritesInFlight = 16;

librados::bufferlist U64(uint64_t v) {
  std::string s;
  keys::AppendBigEndian(s, v, 8);
  librados::bufferlist bl;
  bl.append(s);
  return bl;
}

Result<uint64_t> ReadU64(const std::map<std::string, librados::bufferlist>& values,
                         const std::string& key) {
  auto it = values.find(key);
  if (it == values.end()) return uint64_t{0};
  const std::string s = it->second.to_str();
  if (s.size() != 8) return Status::DataLoss("rados: malformed control key in model object");
  return keys::ReadBigEndian(s, 0, 8);
}

std::string ModelObject(std::string_view model) { return "model." + std::string(model); }

std::string ChunkPrefix(std::string_view model) { return "chunk/" + std::string(model) + "/"; }

std::string ChunkObject(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "%016llx/%u/%u", static_cast<unsigned long long>(seq), tensor,
                chunk);
  return ChunkPrefix(model) + tail;
}

// The write-ownership state of one model in this daemon.
struct ModelState {
  std::mutex mu;  // serializes claims, commits and refreshes of the model
  bool owned = false;
  uint64_t epoch = 0;                   // ours while owned
  Clock::time_point lease_valid_until;  // conservative local view of the lock's expiry
  std::optional<uint64_t> generation;   // the cluster's generation the local cache reflects
  bool indexed = false;                 // known to be in the index (set while owned)

  std::mutex writes_mu;  // guards writes (taken without mu: pushes write while others read)
  std::deque<std::unique_ptr<ChunkStore::PendingPut>> writes;  // chunk writes in flight
};

class RadosBackend final : public StoreBackend {
 public:
  RadosBackend(rocksdb::DB* db, const MetadataFamilies& families, const ClusterOptions& options)
      : db_(db), families_(families), options_(options) {
    letters_ = {{families.models->GetID(), 'm'},
                {families.versions->GetID(), 'v'},
                {families.manifests->GetID(), 'f'},
                {families.codec_state->GetID(), 's'},
                {families.tags->GetID(), 't'}};
    std::random_device random;
    char id[17];
    std::snprintf(id, sizeof id, "%08x%08x", random(), random());
    cookie_ = std::string(id) + " " + options.advertise_url;
  }

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
    for (auto& [model, state] : states_) {
      if (state->owned) io_.unlock(ModelObject(model), kLockName, cookie_);
    }
    for (auto& [model, state] : states_) (void)WaitForWrites(*state);
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

  // Asynchronous: up to kWritesInFlight writes per model; Commit and DiscardChunks wait for
  // them.
  Status PutChunk(const std::string& model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                  std::string_view record) override {
    ModelState& state = StateOf(model);
    std::unique_ptr<ChunkStore::PendingPut> oldest;
    {
      std::lock_guard lock(state.writes_mu);
      state.writes.push_back(chunks_->PutAsync(ChunkObject(model, seq, tensor, chunk), record));
      if (state.writes.size() <= kWritesInFlight) return Status::Ok();
      oldest = std::move(state.writes.front());
      state.writes.pop_front();
    }
    return oldest->Wait();
  }

  size_t ReadWindow() const override { return 8; }

  Status GetChunks(const rocksdb::ReadOptions&, const std::string& model,
                   const std::vector<ChunkAddress>& addresses,
                   std::vector<rocksdb::PinnableSlice>* records) override {
    std::vector<std::string> names;
    for (const ChunkAddress& a : addresses) {
      names.push_back(ChunkObject(model, a.seq, a.tensor, a.chunk));
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> bytes, chunks_->GetAll(names));
    *records = std::vector<rocksdb::PinnableSlice>(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      *(*records)[i].GetSelf() = std::move(bytes[i]);
      (*records)[i].PinSelf();
    }
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
    (void)WaitForWrites(StateOf(model));
    (void)chunks_->DeleteAll(ChunkNames(model, chunks));
  }

  Status ForEachChunk(const rocksdb::ReadOptions&, const std::string& model, uint64_t seq_end,
                      const ChunkVisitor& visit) override {
    CKPT_ASSIGN_OR_RETURN(auto names, ListChunkObjects(model));
    for (const auto& [name, seq, tensor, chunk] : names) {
      if (seq >= seq_end) continue;
      auto record = chunks_->Get(name);
      if (record.status().code() == StatusCode::kNotFound) continue;  // removed since listed
      CKPT_RETURN_IF_ERROR(record.status());
      visit(seq, tensor, chunk, *record);
    }
    return Status::Ok();
  }

  Result<uint64_t> RemoveOrphanChunks(const std::string& model, const std::set<uint64_t>& stored,
                                      uint64_t seq_end) override {
    CKPT_ASSIGN_OR_RETURN(auto names, ListChunkObjects(model));
    // Chunks whose removal is deferred for readers are left to the deferral.
    std::set<std::string> deferred;
    {
      std::lock_guard lock(background_mu_);
      for (const Deferred& d : deferred_) deferred.insert(d.names.begin(), d.names.end());
    }
    std::vector<std::string> orphans;
    for (const auto& [name, seq, tensor, chunk] : names) {
      if (seq < seq_end && !stored.count(seq) && !deferred.count(name)) orphans.push_back(name);
    }
    CKPT_RETURN_IF_ERROR(chunks_->DeleteAll(orphans));
    return static_cast<uint64_t>(orphans.size());
  }

  // ---- metadata

  Status Commit(const std::string& model, ModelChange& change, std::string_view what) override {
    ModelState& state = StateOf(model);
    // Every chunk the change refers to is durable before the commit makes it visible. (Other
    // changes, a tag say, leave the writes of a push in progress to that push.)
    if (change.refers_to_new_chunks) {
      CKPT_RETURN_IF_ERROR(
          WaitForWrites(state).WithContext("model '" + model + "': " + std::string(what)));
    }
    std::lock_guard lock(state.mu);
    if (!state.owned || !state.generation) {
      return Status::Unavailable("model '" + model + "': " + std::string(what) +
                                 ": this daemon no longer holds the model's write lease; retry");
    }
    std::map<std::string, librados::bufferlist> sets;
    std::set<std::string> removals;
    CKPT_RETURN_IF_ERROR(Translate(model, change.batch, &sets, &removals));
    const uint64_t generation = *state.generation + 1;
    uint64_t epoch = state.epoch;
    sets[kGenerationKey] = U64(generation);
    if (change.whole_model) sets[kEpochKey] = U64(++epoch);  // seqs of a new model start higher
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
    DeferRemoval(std::move(unreachable));
    return Status::Ok();
  }

  Status Refresh(const std::string& model) override {
    ModelState& state = StateOf(model);
    std::lock_guard lock(state.mu);
    if (TrustsCache(state)) return Status::Ok();
    std::map<std::string, librados::bufferlist> control;
    int prval = 0;
    librados::ObjectReadOperation op;
    op.omap_get_vals_by_keys({kGenerationKey}, &control, &prval);
    const int r = io_.operate(ModelObject(model), &op, nullptr);
    if (r == -ENOENT) return Resync(model, state);
    CKPT_RETURN_IF_ERROR(FromRados(r, "reading model '" + model + "'"));
    CKPT_ASSIGN_OR_RETURN(const uint64_t generation, ReadU64(control, kGenerationKey));
    if (state.generation && *state.generation == generation) return Status::Ok();
    return Resync(model, state);
  }

  // The generations of all `models` are read concurrently (64 in flight); only the models whose
  // cache is older are then re-read.
  Status RefreshMany(const std::vector<std::string>& models) override {
    constexpr size_t kInFlight = 64;
    struct Check {
      const std::string* model;
      std::map<std::string, librados::bufferlist> control;
      int prval = 0;
      librados::ObjectReadOperation op;
      librados::AioCompletion* completion = nullptr;
    };
    for (size_t begin = 0; begin < models.size(); begin += kInFlight) {
      const size_t end = std::min(models.size(), begin + kInFlight);
      std::vector<Check> checks(end - begin);
      for (size_t i = begin; i < end; ++i) {
        Check& c = checks[i - begin];
        c.model = &models[i];
        c.op.omap_get_vals_by_keys({kGenerationKey}, &c.control, &c.prval);
        c.completion = librados::Rados::aio_create_completion();
        if (io_.aio_operate(ModelObject(models[i]), c.completion, &c.op, nullptr) < 0) {
          c.completion->release();
          c.completion = nullptr;
        }
      }
      for (Check& c : checks) {
        int r = -EIO;
        if (c.completion) {
          c.completion->wait_for_complete();
          r = c.completion->get_return_value();
          c.completion->release();
        }
        ModelState& state = StateOf(*c.model);
        std::lock_guard lock(state.mu);
        if (TrustsCache(state)) continue;
        if (r < 0 && r != -ENOENT) {
          CKPT_RETURN_IF_ERROR(FromRados(r, "reading model '" + *c.model + "'"));
        }
        if (r == 0) {
          CKPT_ASSIGN_OR_RETURN(const uint64_t generation, ReadU64(c.control, kGenerationKey));
          if (state.generation && *state.generation == generation) continue;
        }
        CKPT_RETURN_IF_ERROR(Resync(*c.model, state));
      }
    }
    return Status::Ok();
  }

  Status ClaimWrites(const std::string& model) override {
    ModelState& state = StateOf(model);
    std::lock_guard lock(state.mu);
    if (state.owned && Clock::now() < state.lease_valid_until) {
      // Our cache missed a commit's local apply: rebuild it before writing on top of it.
      if (!state.generation) return Resync(model, state);
      return Status::Ok();
    }
    const std::string oid = ModelObject(model);
    timeval duration = LeaseTimeval();
    const auto requested = Clock::now();
    int r = io_.lock_exclusive(oid, kLockName, cookie_, "ckptd write lease", &duration,
                               LIBRADOS_LOCK_FLAG_MAY_RENEW);
    if (r == -EBUSY || r == -EEXIST) {
      state.owned = false;
      CKPT_ASSIGN_OR_RETURN(auto owner, LeaseHolder(model));
      return Status::Unavailable("model '" + model + "' is written through another ckptd daemon" +
                                 (owner ? " (" + *owner + ")" : std::string()) +
                                 "; send writes there");
    }
    CKPT_RETURN_IF_ERROR(FromRados(r, "taking the write lease of model '" + model + "'"));
    state.lease_valid_until = requested + LeaseMargin();
    if (state.owned) return Status::Ok();  // renewed in time: nobody else can have committed
    // Takeover: fence every former owner by bumping the epoch, then rebuild the cache from what
    // the cluster holds after the bump (commits of a former owner land before it or never).
    std::map<std::string, librados::bufferlist> control;
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
    CKPT_RETURN_IF_ERROR(Resync(model, state));
    state.owned = true;
    lease_takeovers_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  Result<std::optional<std::string>> WriteOwner(const std::string& model) override {
    {
      ModelState& state = StateOf(model);
      std::lock_guard lock(state.mu);
      if (state.owned && Clock::now() < state.lease_valid_until) {
        return std::optional<std::string>();
      }
    }
    return LeaseHolder(model);
  }

  uint64_t SeqFloor(const std::string& model) override {
    ModelState& state = StateOf(model);
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

  void AddStats(StoreStats* stats) override {
    stats->cluster = true;
    stats->lease_takeovers = lease_takeovers_.load(std::memory_order_relaxed);
    stats->leases_lost = leases_lost_.load(std::memory_order_relaxed);
    stats->commits_fenced = commits_fenced_.load(std::memory_order_relaxed);
    std::vector<ModelState*> states;
    {
      std::lock_guard lock(states_mu_);
      for (auto& [model, state] : states_) states.push_back(state.get());
    }
    for (ModelState* state : states) {
      std::lock_guard lock(state->mu);
      stats->models_owned += state->owned ? 1 : 0;
    }
  }

 private:
  // Whether the local cache of a model is current without asking the cluster: this daemon is
  // its only writer (it holds the lease, renewed recently enough). After a pause longer than
  // that, reads check the generation like any other daemon's.
  static bool TrustsCache(const ModelState& state) {
    return state.owned && state.generation && Clock::now() < state.lease_valid_until;
  }

  // Waits for the model's chunk writes in flight; the first error.
  static Status WaitForWrites(ModelState& state) {
    std::deque<std::unique_ptr<ChunkStore::PendingPut>> writes;
    {
      std::lock_guard lock(state.writes_mu);
      writes.swap(state.writes);
    }
    Status first;
    for (auto& write : writes) {
      Status s = write->Wait();
      if (first.ok()) first = std::move(s);
    }
    return first;
  }

  // FailedPrecondition when the model object has a layout newer than this daemon's.
  static Status CheckLayout(const std::string& model,
                            const std::map<std::string, librados::bufferlist>& control) {
    CKPT_ASSIGN_OR_RETURN(const uint64_t layout, ReadU64(control, kLayoutKey));
    if (layout <= kLayoutVersion) return Status::Ok();
    return Status::FailedPrecondition("model '" + model +
                                      "' was written by a newer ckptd (RADOS layout " +
                                      std::to_string(layout) + "; this one knows up to " +
                                      std::to_string(kLayoutVersion) + "): upgrade this daemon");
  }

  ModelState& StateOf(const std::string& model) {
    std::lock_guard lock(states_mu_);
    auto& slot = states_[model];
    if (!slot) slot = std::make_unique<ModelState>();
    return *slot;
  }

  timeval LeaseTimeval() const {
    const auto ms = options_.lease.count();
    return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  }
  // How long after requesting a lock this daemon trusts it: most of the lease, leaving room for
  // clock rate differences and the request's own latency.
  Clock::duration LeaseMargin() const { return options_.lease * 3 / 4; }

  // The advertised URL of the daemon holding the model's lease; nullopt when nobody holds it.
  Result<std::optional<std::string>> LeaseHolder(const std::string& model) {
    int exclusive = 0;
    std::string tag;
    std::list<librados::locker_t> lockers;
    const int r = io_.list_lockers(ModelObject(model), kLockName, &exclusive, &tag, &lockers);
    if (r == -ENOENT) return std::optional<std::string>();
    CKPT_RETURN_IF_ERROR(FromRados(r, "reading the write lease of model '" + model + "'"));
    for (const auto& locker : lockers) {
      if (locker.cookie == cookie_) continue;
      const size_t space = locker.cookie.find(' ');
      return std::optional<std::string>(
          space == std::string::npos ? std::string() : locker.cookie.substr(space + 1));
    }
    return std::optional<std::string>();
  }

  // The cluster's records as local keys and back.
  Status Translate(const std::string& model, const rocksdb::WriteBatch& batch,
                   std::map<std::string, librados::bufferlist>* sets,
                   std::set<std::string>* removals) {
    struct Handler : rocksdb::WriteBatch::Handler {
      RadosBackend* self;
      const std::string* model;
      std::map<std::string, librados::bufferlist>* sets;
      std::set<std::string>* removals;
      Status error;

      rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                            const rocksdb::Slice& value) override {
        auto omap_key = self->OmapKey(*model, cf, key.ToStringView());
        if (!omap_key.ok()) return Fail(omap_key.status());
        librados::bufferlist bl;
        bl.append(value.data(), static_cast<unsigned>(value.size()));
        removals->erase(*omap_key);
        (*sets)[*omap_key] = std::move(bl);
        return rocksdb::Status::OK();
      }
      rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
        auto omap_key = self->OmapKey(*model, cf, key.ToStringView());
        if (!omap_key.ok()) return Fail(omap_key.status());
        sets->erase(*omap_key);
        removals->insert(*omap_key);
        return rocksdb::Status::OK();
      }
      rocksdb::Status DeleteRangeCF(uint32_t cf, const rocksdb::Slice& begin,
                                    const rocksdb::Slice& end) override {
        // The range's keys as this daemon's cache holds them (it is current: we own the model).
        auto family = self->FamilyOf(cf);
        if (!family) return Fail(Status::Internal("rados: delete range in an unknown family"));
        std::unique_ptr<rocksdb::Iterator> it(
            self->db_->NewIterator(rocksdb::ReadOptions(), family));
        for (it->Seek(begin); it->Valid() && it->key().compare(end) < 0; it->Next()) {
          rocksdb::Status s = DeleteCF(cf, it->key());
          if (!s.ok()) return s;
        }
        return it->status();
      }
      rocksdb::Status Fail(Status s) {
        error = std::move(s);
        return rocksdb::Status::Aborted(error.message());
      }
    } handler;
    handler.self = this;
    handler.model = &model;
    handler.sets = sets;
    handler.removals = removals;
    rocksdb::Status s = batch.Iterate(&handler);
    if (!handler.error.ok()) return handler.error;
    return FromRocks(s, "translating a metadata change");
  }

  rocksdb::ColumnFamilyHandle* FamilyOf(uint32_t cf) const {
    for (auto* h : {families_.models, families_.versions, families_.manifests,
                    families_.codec_state, families_.tags}) {
      if (h->GetID() == cf) return h;
    }
    return nullptr;
  }

  // Family letter + the key within the model: "" for the records keyed by the model name alone
  // (models, codec_state), the rest after "<model>\0" for the others.
  Result<std::string> OmapKey(const std::string& model, uint32_t cf, std::string_view key) const {
    auto letter = letters_.find(cf);
    if (letter == letters_.end()) return Status::Internal("rados: write to an unknown family");
    std::string out(1, letter->second);
    if (key == model) return out;
    const std::string prefix = keys::ModelPrefix(model);
    if (!key.starts_with(prefix)) {
      return Status::Internal("rados: a change of model '" + model + "' touches another model");
    }
    out.append(key.substr(prefix.size()));
    return out;
  }

  // Replaces the local cache of `model` with the cluster's records. Reads all pages, retrying
  // when a commit lands in between.
  Status Resync(const std::string& model, ModelState& state) {
    for (int attempt = 0; attempt < 8; ++attempt) {
      std::map<std::string, librados::bufferlist> all;
      std::optional<uint64_t> generation;
      bool consistent = true, missing = false;
      std::string after;
      for (bool more = true; more;) {
        std::map<std::string, librados::bufferlist> page, control;
        int prval = 0, control_rval = 0;
        librados::ObjectReadOperation op;
        op.omap_get_vals_by_keys({kGenerationKey, kLayoutKey}, &control, &control_rval);
        op.omap_get_vals2(after, kOmapPage, &page, &more, &prval);
        const int r = io_.operate(ModelObject(model), &op, nullptr);
        if (r == -ENOENT) {
          missing = true;
          break;
        }
        CKPT_RETURN_IF_ERROR(FromRados(r, "reading model '" + model + "'"));
        CKPT_RETURN_IF_ERROR(CheckLayout(model, control));
        CKPT_ASSIGN_OR_RETURN(const uint64_t g, ReadU64(control, kGenerationKey));
        if (generation && *generation != g) {
          consistent = false;
          break;
        }
        generation = g;
        if (page.empty()) break;
        after = page.rbegin()->first;
        all.merge(page);
      }
      if (!consistent) continue;
      rocksdb::WriteBatch batch;
      batch.Delete(families_.models, model);
      batch.Delete(families_.codec_state, model);
      const std::string begin = keys::ModelPrefix(model), end = keys::ModelPrefixEnd(model);
      for (auto* cf : {families_.versions, families_.manifests, families_.tags}) {
        batch.DeleteRange(cf, begin, end);
      }
      for (const auto& [key, value] : all) {
        if (key.empty() || key[0] == '\x01') continue;
        rocksdb::ColumnFamilyHandle* cf = nullptr;
        switch (key[0]) {
          case 'm':
            cf = families_.models;
            break;
          case 'v':
            cf = families_.versions;
            break;
          case 'f':
            cf = families_.manifests;
            break;
          case 's':
            cf = families_.codec_state;
            break;
          case 't':
            cf = families_.tags;
            break;
          default:
            return Status::DataLoss("rados: model '" + model + "' holds an unknown record family");
        }
        const std::string local =
            (cf == families_.models || cf == families_.codec_state) ? model : begin + key.substr(1);
        const std::string bytes = value.to_str();
        batch.Put(cf, local, bytes);
      }
      CKPT_RETURN_IF_ERROR(
          FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "caching model '" + model + "'"));
      state.generation = missing ? 0 : generation.value_or(0);
      return Status::Ok();
    }
    return Status::Unavailable("model '" + model + "' changes too fast to read consistently");
  }

  std::vector<std::string> ChunkNames(const std::string& model, const ChunkSet& set) const {
    std::vector<std::string> names;
    for (uint32_t t = 0; t < set.chunk_counts.size(); ++t) {
      for (uint32_t c = 0; c < set.chunk_counts[t]; ++c) {
        names.push_back(ChunkObject(model, set.seq, t, c));
      }
    }
    return names;
  }

  struct ListedChunk {
    std::string name;
    uint64_t seq;
    uint32_t tensor;
    uint32_t chunk;
  };
  Result<std::vector<ListedChunk>> ListChunkObjects(const std::string& model) {
    const std::string prefix = ChunkPrefix(model);
    CKPT_ASSIGN_OR_RETURN(auto names, chunks_->List(prefix));
    std::vector<ListedChunk> out;
    for (std::string& oid : names) {
      unsigned long long seq = 0;
      unsigned tensor = 0, chunk = 0;
      if (std::sscanf(oid.c_str() + prefix.size(), "%16llx/%u/%u", &seq, &tensor, &chunk) == 3) {
        out.push_back({std::move(oid), seq, tensor, chunk});
      }
    }
    return out;
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

  // How long chunks a commit made unreachable stay readable: two leases, at least 5 minutes (a
  // multi-gigabyte restore started on the previous generation must be able to finish).
  Clock::duration RemovalGrace() const {
    return std::max<Clock::duration>(options_.lease * 2, std::chrono::minutes(5));
  }

  // Chunks made unreachable by a commit are removed a grace period later (RemovalGrace), so that
  // restores other daemons started from the previous generation can still read them.
  void DeferRemoval(std::vector<std::string> names) {
    if (names.empty()) return;
    std::lock_guard lock(background_mu_);
    deferred_.push_back({Clock::now() + RemovalGrace(), std::move(names)});
  }

  void RunDueDeletions() {
    std::vector<std::string> due;
    {
      std::lock_guard lock(background_mu_);
      while (!deferred_.empty() && (deferred_.front().due <= Clock::now())) {
        auto& names = deferred_.front().names;
        due.insert(due.end(), names.begin(), names.end());
        deferred_.pop_front();
      }
    }
    (void)chunks_->DeleteAll(due);  // best effort: the rest are orphans for GC
  }

  // Renews held leases every third of the lease and runs due deletions.
  void BackgroundLoop() {
    std::unique_lock lock(background_mu_);
    while (!stopping_) {
      background_cv_.wait_for(lock, options_.lease / 3, [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      RenewLeases();
      RunDueDeletions();
      lock.lock();
    }
  }

  void RenewLeases() {
    std::vector<std::pair<std::string, ModelState*>> owned;
    {
      std::lock_guard lock(states_mu_);
      for (auto& [model, state] : states_) owned.emplace_back(model, state.get());
    }
    for (auto& [model, state] : owned) {
      std::lock_guard lock(state->mu);
      if (!state->owned) continue;
      timeval duration = LeaseTimeval();
      const auto requested = Clock::now();
      const int r = io_.lock_exclusive(ModelObject(model), kLockName, cookie_, "ckptd write lease",
                                       &duration, LIBRADOS_LOCK_FLAG_MUST_RENEW);
      if (r == 0) {
        state->lease_valid_until = requested + LeaseMargin();
      } else {
        state->owned = false;  // expired and taken, or unreachable: claim again on next write
        leases_lost_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  rocksdb::DB* const db_;
  const MetadataFamilies families_;
  const ClusterOptions options_;
  std::unordered_map<uint32_t, char> letters_;
  std::string cookie_;  // "<random id> <advertised URL>": identifies this daemon's leases
  librados::Rados cluster_;
  librados::IoCtx io_;
  std::unique_ptr<ChunkStore> chunks_;  // the chunk objects, on io_'s connection

  // Monitoring counters (relaxed: figures, never decisions).
  std::atomic<uint64_t> lease_takeovers_{0};
  std::atomic<uint64_t> leases_lost_{0};
  std::atomic<uint64_t> commits_fenced_{0};

  std::mutex states_mu_;
  std::unordered_map<std::string, std::unique_ptr<ModelState>> states_;  // guarded by states_mu_

  struct Deferred {
    Clock::time_point due;
    std::vector<std::string> names;
  };
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  bool stopping_ = false;          // guarded by background_mu_
  std::deque<Deferred> deferred_;  // guarded by background_mu_
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
