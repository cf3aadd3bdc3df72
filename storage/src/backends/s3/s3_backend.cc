// The S3 backend: chunk records and all metadata in a bucket shared by several daemons; the
// local RocksDB holds a cache of the metadata. Layout: s3_metadata_log.h; protocol:
// docs/design.md ("Scale-out on S3").
//
// A commit of generation g+1 is the creation of its log object with If-None-Match: *: the one
// create that wins is the commit; a writer only ever appends right after the generation its
// cache reflects, so once another daemon has appended (a takeover appends an entry that bumps the
// epoch), a former writer's next commit finds its generation taken and is refused. Seqs are
// allocated above epoch << 40, so chunk records of a fenced writer's unfinished push never share
// a name with the new writer's. Every kSnapshotEvery generations the writer stores a snapshot of
// the model's records, from which any daemon rebuilds its cache.
#include "backends/s3/s3_backend.h"

#include <rocksdb/write_batch.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <random>
#include <thread>

#include "backends/deferred_removals.h"
#include "backends/model_records.h"
#include "backends/s3/s3_block_cache.h"
#include "backends/s3/s3_chunk_store.h"
#include "backends/s3/s3_leases.h"
#include "backends/s3/s3_metadata_log.h"
#include "backends/s3/s3_model_packs.h"
#include "backends/s3/s3_packs.h"
#include "engine/rocks_status.h"
#include "records/keys.h"
#include "records/records.h"

namespace ckpt {
namespace {

using namespace s3_layout;

constexpr uint64_t kSnapshotEvery = 32;  // generations between snapshots
constexpr uint64_t kMaxLogReplay = 64;   // beyond this, a cache is rebuilt from a snapshot
// Read blocks of packs kept in memory: a restore's readers share the blocks of the records they
// read, and a chain's links in several packs stay cached while its chunks are decoded.
constexpr size_t kBlockCacheBytes = 64 << 20;

// Whether a record key is a manifest's ('f' + the u64 BE seq): the chunks under that seq are the
// commit's.
std::optional<uint64_t> ManifestSeq(const std::string& key) {
  if (key.size() == 9 && key[0] == 'f') return storage_keys::ReadBigEndian(key, 1, 8);
  return std::nullopt;
}

// A commit's token decides which of two racing writers won: 128 bits of the system's entropy.
std::string NewToken() {
  std::random_device device;
  char s[33];
  std::snprintf(s, sizeof s, "%08x%08x%08x%08x", device(), device(), device(), device());
  return s;
}

// Thread safety: safe for concurrent use (StoreBackend's contract).
class S3Backend final : public StoreBackend {
 public:
  S3Backend(rocksdb::DB* db, const MetadataFamilies& families, const S3Options& options,
            std::shared_ptr<S3FaultInjector> faults)
      : db_(db),
        options_(options),
        client_(options, std::move(faults)),
        chunks_(NewS3ChunkStore(&client_)),
        records_(db, families),
        leases_(&client_, options.lease, options.advertise_url),
        blocks_(kBlockCacheBytes) {}

  ~S3Backend() override {
    {
      std::lock_guard lock(background_mu_);
      stopping_ = true;
    }
    background_cv_.notify_all();
    if (background_.joinable()) background_.join();
    // Removals still deferred are left: other daemons may be reading those chunks; the next
    // garbage collection of each model removes them as orphans.
    leases_.ReleaseAll();
  }

  Status Open() {
    CKPT_RETURN_IF_ERROR(client_.Probe());
    background_ = std::thread([this] { BackgroundLoop(); });
    return Status::Ok();
  }

  // ---- chunk records

  Status PutChunk(const std::string& model, uint64_t seq, uint32_t tensor, uint32_t chunk,
                  std::string_view record) override {
    if (options_.pack_bytes == 0) {
      const std::string name = ChunkKey(model, seq, tensor, chunk);
      return leases_.StateOf(model).writes.Add(name,
                                               [&] { return chunks_->PutAsync(name, record); });
    }
    PackState& packs = PacksOf(model);
    for (const ModelPacks::FullPack& full : packs.index.Add(seq, tensor, chunk, record)) {
      CKPT_RETURN_IF_ERROR(WritePack(packs, full));
    }
    return Status::Ok();
  }

  // Closes the model's open pack, so that records written next land in other packs. Only the
  // model's writer calls it, between its own writes.
  Status SealChunkWrites(const std::string& model) override {
    PackState& packs = PacksOf(model);
    if (auto full = packs.index.Close()) return WritePack(packs, *full);
    return Status::Ok();
  }

  bool WritesFreshChunkNames() const override { return options_.pack_bytes > 0; }

  size_t ReadWindow() const override { return 16; }

  Status GetChunks(const rocksdb::ReadOptions&, const std::string& model,
                   const std::vector<ChunkAddress>& addresses,
                   std::vector<rocksdb::PinnableSlice>* records) override {
    std::vector<std::string> bytes(addresses.size());
    std::vector<std::future<Status>> reads;
    for (size_t i = 0; i < addresses.size(); ++i) {
      reads.push_back(client_.Async([this, &model, &addresses, &bytes, i]() -> Status {
        const ChunkAddress& a = addresses[i];
        CKPT_ASSIGN_OR_RETURN(bytes[i], ReadRecord(model, a.seq, a.tensor, a.chunk));
        return Status::Ok();
      }));
    }
    CKPT_RETURN_IF_ERROR(WaitForAll(reads));
    PinRecords(std::move(bytes), records);
    return Status::Ok();
  }

  Status GetChunk(const rocksdb::ReadOptions&, const std::string& model, uint64_t seq,
                  uint32_t tensor, uint32_t chunk, rocksdb::PinnableSlice* record) override {
    CKPT_ASSIGN_OR_RETURN(*record->GetSelf(), ReadRecord(model, seq, tensor, chunk));
    record->PinSelf();
    return Status::Ok();
  }

  void DiscardChunks(const std::string& model, const ChunkSet& chunks) override {
    S3ModelState& state = leases_.StateOf(model);
    PackState& packs = PacksOf(model);
    (void)state.writes.WaitAll();
    (void)packs.writes.WaitAll();
    {
      // A commit that may have landed may refer to them: garbage collection decides later.
      std::lock_guard lock(state.mu);
      if (state.kept_seqs.count(chunks.seq)) return;
    }
    if (options_.pack_bytes > 0) {
      (void)chunks_->DeleteAll(packs.index.Discard(chunks));
    } else {
      (void)chunks_->DeleteAll(ChunkKeys(model, chunks));
    }
  }

  // Records of their own objects, then the packs the index lists (their members the index still
  // holds), then packs of seqs the index has none for (an interrupted push's: every member).
  Status ForEachChunk(const rocksdb::ReadOptions&, const std::string& model, uint64_t seq_end,
                      const ChunkVisitor& visit) override {
    CKPT_ASSIGN_OR_RETURN(Listing listed, ListChunks(model));
    const std::set<std::string> deferred = removals_.Pending();
    CKPT_RETURN_IF_ERROR(VisitListedChunks(*chunks_, listed.chunks, seq_end, deferred, visit));
    ModelPacks& index = PacksOf(model).index;
    std::vector<ModelPacks::CommittedPack> packs = index.Committed(seq_end);
    std::set<uint64_t> indexed;
    for (const auto& pack : packs) indexed.insert(pack.seq);
    for (const ListedPack& pack : listed.packs) {
      if (pack.seq >= seq_end || indexed.count(pack.seq) || deferred.count(pack.name) ||
          index.Known(pack.seq, pack.id)) {
        continue;
      }
      packs.push_back({pack.seq, pack.name, {}});  // members from its footer
    }
    return VisitPacks(packs, visit);
  }

  Result<uint64_t> RemoveOrphanChunks(const std::string& model, const std::set<uint64_t>& stored,
                                      uint64_t seq_end) override {
    CKPT_ASSIGN_OR_RETURN(Listing listed, ListChunks(model));
    // Chunks whose removal is deferred for readers are left to the deferral.
    const std::set<std::string> deferred = removals_.Pending();
    CKPT_ASSIGN_OR_RETURN(uint64_t removed,
                          RemoveListedOrphans(*chunks_, listed.chunks, stored, seq_end, deferred));
    ModelPacks& index = PacksOf(model).index;
    std::vector<std::string> orphans;
    // A pack is an orphan when no index entry lists it, nor did within the readers' grace (a
    // deleted version's packs stay for the grace, as their removal does).
    for (const ListedPack& pack : listed.packs) {
      if (pack.seq < seq_end && !deferred.count(pack.name) && !index.Known(pack.seq, pack.id)) {
        orphans.push_back(pack.name);
      }
    }
    CKPT_ASSIGN_OR_RETURN(const uint64_t records, CountRecords(orphans));
    CKPT_RETURN_IF_ERROR(chunks_->DeleteAll(orphans));
    return removed + records;
  }

  // ---- metadata

  Status Commit(const std::string& model, ModelChange& change, std::string_view what) override {
    S3ModelState& state = leases_.StateOf(model);
    const std::string context = "model '" + model + "': " + std::string(what);
    PackState& packs = PacksOf(model);
    if (change.refers_to_new_chunks) {
      if (auto full = packs.index.Close()) {
        CKPT_RETURN_IF_ERROR(WritePack(packs, *full).WithContext(context));
      }
      CKPT_RETURN_IF_ERROR(packs.writes.WaitAll().WithContext(context));
      CKPT_RETURN_IF_ERROR(state.writes.WaitAll().WithContext(context));
    }
    std::lock_guard lock(state.mu);
    if (state.unsettled_generation) {
      return Status::Unavailable(
          context + ": an earlier commit of the model has no known outcome yet; retry");
    }
    if (!state.HoldsLease() || !state.generation) {
      return Status::Unavailable(context +
                                 ": this daemon no longer holds the model's write lease; retry");
    }
    if (state.generation != state.own_generation) {
      // Another daemon appended since our last entry (our cache followed it): we were fenced.
      state.SetOwned(false);
      return Status::Unavailable(context +
                                 ": refused, another daemon wrote the model since; retry (it will "
                                 "be redirected or take the model over)");
    }
    LogEntry entry;
    CKPT_RETURN_IF_ERROR(records_.Translate(model, change.batch, &entry.sets, &entry.removals));
    // The packs of the seqs the change stores join the index; what it makes unreachable leaves.
    std::vector<ChunkSet> new_seqs;
    if (change.refers_to_new_chunks) {
      for (const auto& [key, value] : entry.sets) {
        const auto seq = ManifestSeq(key);
        if (!seq) continue;
        auto manifest = ManifestRecord::DecodeFrom(value);
        if (!manifest.ok()) return manifest.status().WithContext(context);
        new_seqs.push_back(ChunkSet::Of(*seq, *manifest));
      }
    }
    std::vector<ChunkAddress> unpacked;
    const ModelPacks::Change pack_change =
        packs.index.Plan(new_seqs, change.unreachable, change.whole_model, &unpacked);
    entry.sets.insert(pack_change.sets.begin(), pack_change.sets.end());
    entry.removals.insert(pack_change.removals.begin(), pack_change.removals.end());
    entry.generation = *state.generation + 1;
    entry.epoch = state.epoch + (change.whole_model ? 1 : 0);  // seqs of a new model start higher
    if (change.foreign_seqs_end > 0) {
      entry.epoch = std::max(entry.epoch, ((change.foreign_seqs_end - 1) >> kSeqEpochShift) + 1);
    }
    entry.token = NewToken();
    entry.writer_url = options_.advertise_url;
    auto appended = Append(model, entry);
    if (!appended.ok()) {
      // Unknown whether the entry landed: the next claim settles it, and chunks are kept until
      // then.
      state.generation.reset();
      state.unsettled_generation = entry.generation;
      for (const auto& [key, value] : entry.sets) {
        if (auto seq = ManifestSeq(key)) state.kept_seqs.insert(*seq);
      }
      // The index of the packs is read again from the log once the commit is settled.
      packs.index.Forget(pack_change.attached);
      return appended.status().WithContext(context);
    }
    if (!*appended) {
      // Another daemon appended first: it took the model over. Nothing of ours applied.
      state.SetOwned(false);
      state.generation.reset();
      commits_fenced_.fetch_add(1, std::memory_order_relaxed);
      return Status::Unavailable(context +
                                 ": refused, another daemon took over the model's write lease; "
                                 "retry (it will be redirected)");
    }
    state.generation = entry.generation;
    state.own_generation = entry.generation;
    state.epoch = entry.epoch;
    packs.index.Apply(pack_change);
    // The local cache follows; if this fails the next claim or refresh rebuilds it.
    Status local = FromRocks(db_->Write(rocksdb::WriteOptions(), &change.batch), what);
    if (!local.ok()) state.generation.reset();
    if (local.ok() && entry.generation >= state.snapshot_generation + kSnapshotEvery) {
      WriteSnapshot(model, state);
    }
    std::vector<std::string> unreachable = pack_change.dead;
    for (const ChunkAddress& a : unpacked) {
      unreachable.push_back(ChunkKey(model, a.seq, a.tensor, a.chunk));
    }
    removals_.Defer(std::move(unreachable), RemovalGrace(options_.lease));
    return Status::Ok();
  }

  Status Refresh(const std::string& model) override {
    S3ModelState& state = leases_.StateOf(model);
    std::lock_guard lock(state.mu);
    if (state.TrustsCache()) return Status::Ok();
    return Resync(model, state);
  }

  // Refreshes run on threads of their own (a refresh waits on the client's threads), 16 at once.
  Status RefreshMany(const std::vector<std::string>& models) override {
    constexpr size_t kInFlight = 16;
    Status first;
    for (size_t begin = 0; begin < models.size(); begin += kInFlight) {
      std::vector<std::future<Status>> refreshes;
      for (size_t i = begin; i < std::min(models.size(), begin + kInFlight); ++i) {
        refreshes.push_back(
            std::async(std::launch::async, [this, &models, i] { return Refresh(models[i]); }));
      }
      Status s = WaitForAll(refreshes);
      if (first.ok()) first = std::move(s);
    }
    return first;
  }

  Status ClaimWrites(const std::string& model) override {
    S3ModelState& state = leases_.StateOf(model);
    std::lock_guard lock(state.mu);
    if (state.unsettled_generation) CKPT_RETURN_IF_ERROR(Settle(model, state));
    bool taken = false;
    if (!state.HoldsLease()) {
      CKPT_ASSIGN_OR_RETURN(taken, leases_.Lock(model, state));
    }
    if (!taken) {
      // Our cache missed a commit's local apply: rebuild it before writing on top of it.
      if (!state.generation) CKPT_RETURN_IF_ERROR(Resync(model, state));
      if (state.generation == state.own_generation) {
        state.SetOwned(true);
        return Status::Ok();
      }
      // The log moved past our last entry (a settled commit of ours, a former writer's last
      // entry): take the model over again, so that our commits follow an entry of ours.
    }
    // Takeover: append an entry that bumps the epoch. A former writer's commit lands before it
    // or never; the cache is rebuilt from what the log holds before it.
    for (int attempt = 0; attempt < 8; ++attempt) {
      CKPT_RETURN_IF_ERROR(Resync(model, state));
      LogEntry entry;
      entry.generation = *state.generation + 1;
      entry.epoch = state.epoch + 1;
      entry.token = NewToken();
      entry.writer_url = options_.advertise_url;
      // Marked before it exists, so that compaction never removes it (Append says why).
      CKPT_RETURN_IF_ERROR(client_.Put(KeptKey(model, entry.generation), "")
                               .status()
                               .WithContext("taking over model '" + model + "'"));
      auto appended = Append(model, entry);
      if (!appended.ok()) {
        state.generation.reset();
        return appended.status().WithContext("taking over model '" + model + "'");
      }
      if (!*appended) continue;  // a last commit of the former writer landed first
      state.generation = entry.generation;
      state.own_generation = entry.generation;
      state.epoch = entry.epoch;
      state.SetOwned(true);
      lease_takeovers_.fetch_add(1, std::memory_order_relaxed);
      return Status::Ok();
    }
    return Status::Unavailable("model '" + model + "' changes too fast to take over; retry");
  }

  Result<std::optional<std::string>> WriteOwner(const std::string& model) override {
    {
      S3ModelState& state = leases_.StateOf(model);
      std::lock_guard lock(state.mu);
      if (state.HoldsLease()) return std::optional<std::string>();
    }
    return leases_.Holder(model);
  }

  uint64_t SeqFloor(const std::string& model) override {
    S3ModelState& state = leases_.StateOf(model);
    std::lock_guard lock(state.mu);
    return state.epoch << kSeqEpochShift;
  }

  Result<std::optional<std::vector<std::string>>> ListModelNames() override {
    std::vector<std::string> names;
    std::string token;
    do {
      CKPT_ASSIGN_OR_RETURN(s3_xml::ListPage page, client_.ListPage("models/", "", 0, token, "/"));
      for (const std::string& prefix : page.common_prefixes) {
        // "models/<name>/"
        if (prefix.size() > 8) names.push_back(prefix.substr(7, prefix.size() - 8));
      }
      token = page.truncated ? page.next_continuation_token : "";
    } while (!token.empty());
    return std::optional<std::vector<std::string>>(std::move(names));
  }

  bool IsLocal() const override { return false; }
  std::string Location() const override {
    return "the S3 bucket '" + options_.bucket + "'" +
           (options_.prefix.empty() ? "" : " (prefix '" + options_.prefix + "')");
  }

  void AddStats(StoreStats* stats) override {
    stats->cluster = true;
    stats->lease_takeovers = lease_takeovers_.load(std::memory_order_relaxed);
    stats->leases_lost = leases_.leases_lost();
    stats->commits_fenced = commits_fenced_.load(std::memory_order_relaxed);
    stats->models_owned += leases_.OwnedCount();
    stats->s3 = true;
    stats->s3_requests = client_.requests();
    stats->s3_bytes_sent = client_.bytes_sent();
    stats->s3_bytes_received = client_.bytes_received();
  }

 private:
  std::vector<std::string> ChunkKeys(const std::string& model, const ChunkSet& set) const {
    return ChunkSetNames(set, [&](uint64_t seq, uint32_t tensor, uint32_t chunk) {
      return ChunkKey(model, seq, tensor, chunk);
    });
  }

  // A model's packs: the index and the pack writes in flight (fewer than single chunk writes:
  // each holds up to pack_bytes).
  struct PackState {
    PackState(const std::string& model, uint64_t pack_bytes, ModelPacks::Clock::duration grace)
        : index(model, pack_bytes, grace) {}
    ModelPacks index;
    ChunkWriteQueue writes{4};
  };

  PackState& PacksOf(const std::string& model) {
    std::lock_guard lock(packs_mu_);
    auto& packs = packs_[model];
    if (!packs) {
      packs = std::make_unique<PackState>(model, options_.pack_bytes, RemovalGrace(options_.lease));
    }
    return *packs;
  }

  std::vector<PackState*> AllPacks() {
    std::lock_guard lock(packs_mu_);
    std::vector<PackState*> all;
    for (auto& [model, packs] : packs_) all.push_back(packs.get());
    return all;
  }

  Status WritePack(PackState& packs, const ModelPacks::FullPack& full) {
    return packs.writes.Add(full.key, [&] { return chunks_->PutAsync(full.key, full.bytes); });
  }

  // A record: from the pack being filled, a read block of its pack (cached), or its own object.
  Result<std::string> ReadRecord(const std::string& model, uint64_t seq, uint32_t tensor,
                                 uint32_t chunk) {
    auto at = PacksOf(model).index.Find(seq, tensor, chunk);
    if (!at) return chunks_->Get(ChunkKey(model, seq, tensor, chunk));
    if (at->open) return std::move(at->bytes);
    if (at->uncommitted) {
      // Only its push reads a record before the commit, and keeps the records it may read in
      // memory: a record of a pack being written is read from the bucket, as written.
      CKPT_ASSIGN_OR_RETURN(S3Object object, client_.Get(at->key, at->offset, at->length));
      return std::move(object.body);
    }
    CKPT_ASSIGN_OR_RETURN(
        S3BlockCache::Block block,
        blocks_.Get(at->key, at->block.offset, at->block.length, [&]() -> Result<std::string> {
          CKPT_ASSIGN_OR_RETURN(S3Object object,
                                client_.Get(at->key, at->block.offset, at->block.length));
          return std::move(object.body);
        }));
    if (block->size() != at->block.length) {
      return Status::DataLoss("s3: pack '" + at->key + "' is shorter than its index says");
    }
    return block->substr(at->offset - at->block.offset, at->length);
  }

  // Reads each pack whole (a few at a time) and visits its members: those `pack.members` lists,
  // or those of its footer when it lists none.
  Status VisitPacks(const std::vector<ModelPacks::CommittedPack>& packs,
                    const ChunkVisitor& visit) {
    constexpr size_t kInFlight = 4;
    for (size_t begin = 0; begin < packs.size(); begin += kInFlight) {
      const size_t end = std::min(packs.size(), begin + kInFlight);
      std::vector<std::string> bodies(end - begin);
      std::vector<std::future<Status>> reads;
      for (size_t i = begin; i < end; ++i) {
        reads.push_back(client_.Async([this, &packs, &bodies, begin, i]() -> Status {
          auto object = client_.Get(packs[i].key);
          // A pack no index lists may be removed since it was listed (orphan removal, a
          // removal falling due): nothing to visit.
          if (object.status().code() == StatusCode::kNotFound && packs[i].members.empty()) {
            return Status::Ok();
          }
          CKPT_RETURN_IF_ERROR(object.status());
          bodies[i - begin] = std::move(object->body);
          return Status::Ok();
        }));
      }
      CKPT_RETURN_IF_ERROR(WaitForAll(reads));
      for (size_t i = begin; i < end; ++i) {
        const std::string& body = bodies[i - begin];
        std::vector<s3_layout::PackMember> members = packs[i].members;
        if (members.empty()) {
          if (body.empty()) continue;  // removed since listed
          CKPT_ASSIGN_OR_RETURN(members, DecodePackFooter(body));
        }
        for (const s3_layout::PackMember& m : members) {
          if (m.offset + m.length > body.size()) {
            return Status::DataLoss("s3: pack '" + packs[i].key +
                                    "' is shorter than its index says");
          }
          visit(packs[i].seq, m.tensor, m.chunk, std::string_view(body).substr(m.offset, m.length));
        }
      }
    }
    return Status::Ok();
  }

  // How many records the packs `keys` hold, by their footers (a pack whose footer does not read
  // counts as one; one already gone as none).
  Result<uint64_t> CountRecords(const std::vector<std::string>& keys) {
    std::vector<uint64_t> counts(keys.size());
    std::vector<std::future<Status>> reads;
    for (size_t i = 0; i < keys.size(); ++i) {
      reads.push_back(client_.Async([this, &keys, &counts, i]() -> Status {
        auto object = client_.Get(keys[i]);
        if (object.status().code() == StatusCode::kNotFound) return Status::Ok();
        CKPT_RETURN_IF_ERROR(object.status());
        auto members = DecodePackFooter(object->body);
        counts[i] = members.ok() ? members->size() : 1;
        return Status::Ok();
      }));
    }
    CKPT_RETURN_IF_ERROR(WaitForAll(reads));
    uint64_t total = 0;
    for (const uint64_t n : counts) total += n;
    return total;
  }

  // A model's chunk objects: records of their own and packs.
  struct Listing {
    std::vector<ListedChunk> chunks;
    std::vector<ListedPack> packs;
  };

  Result<Listing> ListChunks(const std::string& model) {
    std::vector<std::future<Status>> lists;
    std::vector<std::vector<std::string>> names(kChunkPrefixes);
    for (int h = 0; h < kChunkPrefixes; ++h) {
      lists.push_back(client_.Async([this, &model, &names, h]() -> Status {
        CKPT_ASSIGN_OR_RETURN(names[h], chunks_->List(ChunkListPrefix(model, h)));
        return Status::Ok();
      }));
    }
    CKPT_RETURN_IF_ERROR(WaitForAll(lists));
    Listing out;
    for (auto& prefix_names : names) {
      for (std::string& key : prefix_names) {
        if (auto pack = ParsePackKey(model, key)) {
          out.packs.push_back(std::move(*pack));
        } else if (auto c = ParseChunkKey(model, std::move(key))) {
          out.chunks.push_back(std::move(*c));
        }
      }
    }
    return out;
  }

  // Creates the entry's log object: true when ours holds the generation (also when the answer
  // to our create was lost and a retry found it), false when another writer's does; an error
  // when the store could not tell.
  //
  // A writer commits only right after its own last entry (own_generation): the slot after it is
  // its next commit's, or the takeover entry (or settled slot) of whoever came after it, and
  // those are kept from compaction, so a fenced writer's create always finds them there.
  Result<bool> Append(const std::string& model, const LogEntry& entry) {
    const std::string key = LogKey(model, entry.generation);
    S3Condition create;
    create.if_none_match = true;
    auto created = client_.Put(key, EncodeLogEntry(entry), create);
    if (created.ok()) return true;
    if (created.status().code() != StatusCode::kFailedPrecondition) return created.status();
    CKPT_ASSIGN_OR_RETURN(S3Object object, client_.Get(key));
    CKPT_ASSIGN_OR_RETURN(LogEntry winner, DecodeLogEntry(object.body));
    return winner.token == entry.token;
  }

  // Settles a commit whose outcome was unknown, so that it cannot land later: its generation is
  // first kept from compaction (a late create can never land in a slot compaction freed), then
  // occupied by an entry that changes nothing if the log has not reached it (generations are
  // filled in order: each create follows an entry its writer read). The cache is read again
  // after; the next claim then takes the model over again unless the settling entry is ours.
  // REQUIRES: state.mu.
  Status Settle(const std::string& model, S3ModelState& state) {
    const std::string context = "settling a commit of model '" + model + "'";
    const uint64_t generation = *state.unsettled_generation;
    CKPT_RETURN_IF_ERROR(client_.Put(KeptKey(model, generation), "").status().WithContext(context));
    CKPT_ASSIGN_OR_RETURN(const uint64_t head, Newest(LogPrefix(model)));
    if (head < generation) {
      LogEntry noop;
      noop.generation = generation;
      noop.epoch = state.epoch;  // nobody appended since our last entry: the epoch is ours
      noop.token = NewToken();
      noop.writer_url = options_.advertise_url;
      CKPT_ASSIGN_OR_RETURN(const bool ours, Append(model, noop));
      if (ours) state.own_generation = generation;
    }
    state.unsettled_generation.reset();
    state.generation.reset();
    return Status::Ok();
  }

  // The newest generation under `prefix` (0 when there is none).
  Result<uint64_t> Newest(const std::string& prefix) {
    CKPT_ASSIGN_OR_RETURN(s3_xml::ListPage page, client_.ListPage(prefix, "", 1));
    for (const auto& object : page.objects) {
      if (auto g = GenerationOf(prefix, object.key)) return *g;
    }
    return uint64_t{0};
  }

  // The log entries (begin, end], read concurrently. NotFound when one is gone (a snapshot
  // replaced it).
  Result<std::vector<LogEntry>> ReadEntries(const std::string& model, uint64_t begin,
                                            uint64_t end) {
    std::vector<LogEntry> entries(end - begin);
    std::vector<std::future<Status>> reads;
    for (uint64_t g = begin + 1; g <= end; ++g) {
      reads.push_back(client_.Async([this, &model, &entries, begin, g]() -> Status {
        CKPT_ASSIGN_OR_RETURN(S3Object object, client_.Get(LogKey(model, g)));
        CKPT_ASSIGN_OR_RETURN(entries[g - begin - 1], DecodeLogEntry(object.body));
        return Status::Ok();
      }));
    }
    CKPT_RETURN_IF_ERROR(WaitForAll(reads));
    return entries;
  }

  // Brings the local cache of `model` to the log's head. REQUIRES: state.mu.
  Status Resync(const std::string& model, S3ModelState& state) {
    const std::string context = "reading model '" + model + "'";
    for (int attempt = 0; attempt < 8; ++attempt) {
      CKPT_ASSIGN_OR_RETURN(const uint64_t head, Newest(LogPrefix(model)));
      if (state.generation && *state.generation == head) return Status::Ok();
      rocksdb::WriteBatch batch;
      uint64_t epoch = state.epoch;
      if (state.generation && head > *state.generation &&
          head - *state.generation <= kMaxLogReplay) {
        // Replay the entries since the cache's generation.
        auto entries = ReadEntries(model, *state.generation, head);
        if (entries.status().code() == StatusCode::kNotFound) {
          state.generation.reset();
          continue;
        }
        CKPT_RETURN_IF_ERROR(entries.status().WithContext(context));
        for (const LogEntry& e : *entries) {
          CKPT_RETURN_IF_ERROR(records_.ChangeBatch(model, e.sets, e.removals, &batch));
          CKPT_RETURN_IF_ERROR(
              PacksOf(model).index.ApplyRecords(e.sets, e.removals).WithContext(context));
          epoch = e.epoch;
        }
      } else {
        // From the newest snapshot, then the entries after it.
        Snapshot snapshot;
        CKPT_ASSIGN_OR_RETURN(const uint64_t newest, Newest(SnapshotPrefix(model)));
        if (newest > 0) {
          auto object = client_.Get(SnapshotKey(model, newest));
          if (object.status().code() == StatusCode::kNotFound) continue;  // replaced meanwhile
          CKPT_RETURN_IF_ERROR(object.status().WithContext(context));
          CKPT_ASSIGN_OR_RETURN(snapshot, DecodeSnapshot(object->body));
        }
        if (snapshot.generation > head) continue;  // written after our listing of the log
        auto entries = ReadEntries(model, snapshot.generation, head);
        if (entries.status().code() == StatusCode::kNotFound) continue;
        CKPT_RETURN_IF_ERROR(entries.status().WithContext(context));
        epoch = snapshot.epoch;
        for (const LogEntry& e : *entries) {
          for (const std::string& key : e.removals) snapshot.records.erase(key);
          for (const auto& [key, value] : e.sets) snapshot.records[key] = value;
          epoch = e.epoch;
        }
        CKPT_RETURN_IF_ERROR(records_.CacheBatch(model, snapshot.records, &batch));
        CKPT_RETURN_IF_ERROR(PacksOf(model).index.Replace(snapshot.records).WithContext(context));
        state.snapshot_generation = snapshot.generation;
      }
      CKPT_RETURN_IF_ERROR(
          FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "caching model '" + model + "'"));
      state.generation = head;
      state.epoch = epoch;
      return Status::Ok();
    }
    return Status::Unavailable("model '" + model + "' changes too fast to read consistently");
  }

  // Stores the model's records as of its current generation, then removes the log entries and
  // snapshots the one before it made redundant (a reader that still needs them starts over from
  // the newer snapshot), except takeover entries, which fence former writers for good. Best
  // effort: a failure leaves a longer log. REQUIRES: state.mu, the cache current.
  void WriteSnapshot(const std::string& model, S3ModelState& state) {
    auto records = records_.CachedRecords(model);
    if (!records.ok()) return;
    records->merge(PacksOf(model).index.Records());
    Snapshot snapshot{*state.generation, state.epoch, std::move(*records)};
    S3Condition create;  // only one snapshot of a generation is ever written
    create.if_none_match = true;
    auto written =
        client_.Put(SnapshotKey(model, snapshot.generation), EncodeSnapshot(snapshot), create);
    if (!written.ok() && written.status().code() != StatusCode::kFailedPrecondition) return;
    const uint64_t previous = state.snapshot_generation;
    state.snapshot_generation = snapshot.generation;
    if (previous == 0) return;
    auto takeovers = client_.ListAll(KeptPrefix(model));
    if (!takeovers.ok()) return;
    std::set<uint64_t> kept;
    for (const auto& object : *takeovers) {
      if (auto g = GenerationOf(KeptPrefix(model), object.key)) kept.insert(*g);
    }
    std::vector<std::string> redundant;
    auto logs = client_.ListAll(LogPrefix(model));
    if (logs.ok()) {
      for (const auto& object : *logs) {
        auto g = GenerationOf(LogPrefix(model), object.key);
        if (g && *g <= previous && !kept.count(*g)) redundant.push_back(object.key);
      }
    }
    auto snapshots = client_.ListAll(SnapshotPrefix(model));
    if (snapshots.ok()) {
      for (const auto& object : *snapshots) {
        auto g = GenerationOf(SnapshotPrefix(model), object.key);
        if (g && *g < previous) redundant.push_back(object.key);
      }
    }
    (void)client_.DeleteMany(redundant);
  }

  // Renews held leases every third of the lease and runs due deletions beside (a long removal
  // never delays a renewal).
  void BackgroundLoop() {
    std::future<void> removing;
    std::unique_lock lock(background_mu_);
    while (!stopping_) {
      background_cv_.wait_for(lock, options_.lease / 3, [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      leases_.RenewAll();
      for (PackState* packs : AllPacks()) packs->index.Prune();
      if (!removing.valid() ||
          removing.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        removing = std::async(std::launch::async, [this] { removals_.RunDue(*chunks_); });
      }
      lock.lock();
    }
    lock.unlock();
    if (removing.valid()) removing.wait();
  }

  rocksdb::DB* const db_;
  const S3Options options_;
  S3Client client_;
  std::unique_ptr<ChunkStore> chunks_;  // on client_
  const ModelRecords records_;
  S3Leases leases_;

  // Monitoring counters (relaxed: figures, never decisions).
  std::atomic<uint64_t> lease_takeovers_{0};
  std::atomic<uint64_t> commits_fenced_{0};

  S3BlockCache blocks_;
  std::mutex packs_mu_;
  std::unordered_map<std::string, std::unique_ptr<PackState>> packs_;  // guarded by packs_mu_

  DeferredRemovals removals_;
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  bool stopping_ = false;  // guarded by background_mu_
  std::thread background_;
};

}  // namespace

Result<std::unique_ptr<StoreBackend>> NewS3Backend(rocksdb::DB* db,
                                                   const MetadataFamilies& families,
                                                   const S3Options& options,
                                                   std::shared_ptr<S3FaultInjector> faults) {
  auto backend = std::make_unique<S3Backend>(db, families, options, std::move(faults));
  CKPT_RETURN_IF_ERROR(backend->Open());
  return std::unique_ptr<StoreBackend>(std::move(backend));
}

}  // namespace ckpt
