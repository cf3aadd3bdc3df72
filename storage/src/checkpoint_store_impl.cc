// CheckpointStoreImpl, the store's front for every backend (local RocksDB or RADOS): opens the
// database and the backend, and answers each call with the part that owns it — the catalog (reads),
// the push session, the restore stream, the model writer (every other change) and maintenance.
// Schema and commit protocol: docs/design.md.
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "backends/s3/s3_backend.h"
#include "backends/store_backend.h"
#include "ckpt/storage/checkpoint_store.h"
#include "context/reference_cache.h"
#include "context/store_context.h"
#include "engine/directory_bytes.h"
#include "engine/scoped_snapshot.h"
#include "engine/store_schema.h"
#include "maintenance/maintenance.h"
#include "maintenance/store_copy.h"
#include "read/catalog.h"
#include "read/encoded_restore.h"
#include "read/restore_stream.h"
#include "read/restore_view.h"
#include "records/keys.h"
#include "store_open.h"
#include "uploads/sharded_uploads.h"
#include "write/model_writer.h"
#include "write/push_plan.h"
#include "write/push_session.h"
#ifdef CKPT_WITH_RADOS
#include "backends/rados/rados_backend.h"
#endif

namespace ckpt {
namespace {

// How long the commit of a sharded version waits for its model's turn (a push or a pass of
// the background work holding it).
constexpr auto kCommitLockWait = std::chrono::milliseconds(60'000);

// Thread safety: safe for concurrent use (CheckpointStore's contract).
class CheckpointStoreImpl final : public CheckpointStore {
 public:
  CheckpointStoreImpl(const StoreOptions& options, std::shared_ptr<rocksdb::Env> env,
                      std::shared_ptr<S3FaultInjector> s3_faults)
      : options_(options),
        env_(std::move(env)),
        s3_faults_(std::move(s3_faults)),
        cache_(options.reference_cache_bytes),
        since_deltas_(options.since_delta_cache_bytes),
        codec_(NewLosslessCodec(LosslessCodecOptions{options.zstd_level})),
        health_(env_ ? env_.get() : rocksdb::Env::Default(), options.data_dir,
                options.min_free_bytes),
        maintenance_(ctx_),
        writer_(ctx_, &maintenance_),
        uploads_(
            &options_, &health_,
            [this](const std::string& model, uint64_t version, uint64_t body_size,
                   const PushOptions& push_options) {
              return BeginAssembledPush(model, version, body_size, push_options);
            },
            [this](const std::string& model, uint64_t version, uint64_t body_size,
                   const PushOptions& push_options) -> Result<std::unique_ptr<ChunkedPush>> {
              CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
              return BeginChunkedPush(ctx_, writer_, name, version, body_size, push_options,
                                      kCommitLockWait);
            },
            [this](const std::string& model, uint64_t version, const ShardHeader& shard,
                   uint32_t shard_count, bool arriving) -> Result<CodingPlan> {
              CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
              if (!arriving) return PlanShardOf(ctx_, writer_, name, version, shard, shard_count);
              return PlanShardNow(name, version, shard, shard_count);
            },
            [this](const std::string& model, uint64_t version) {
              return CommittedShardsOf(model, version);
            },
            [this](const std::string& model, bool claim) -> Result<std::optional<std::string>> {
              if (claim) {
                Status claimed = backend_->ClaimWrites(model);
                if (claimed.ok()) return std::optional<std::string>();
                if (claimed.code() != StatusCode::kUnavailable) return claimed;
              }
              CKPT_ASSIGN_OR_RETURN(std::optional<std::string> owner, backend_->WriteOwner(model));
              // Claimed by another daemon that advertises no URL: still not this one.
              if (claim && !owner) return std::optional<std::string>(std::string());
              return owner;
            }) {}

  ~CheckpointStoreImpl() override {
    if (!db_) return;
    for (auto* h : families_.all) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db_->Close().PermitUncheckedError();
  }

  Status OpenDb() {
    CKPT_RETURN_IF_ERROR(OpenStoreDatabase(options_.data_dir, env_.get(), health_.NewListener(),
                                           options_.engine_log, &db_, &families_));
    health_.Attach(db_.get(), families_.chunks);
    ctx_.db = db_.get();
    ctx_.health = &health_;
    static_cast<MetadataFamilies&>(ctx_) = families_;
    ctx_.chunks = families_.chunks;
    ctx_.tags_mu = &tags_mu_;
    if (options_.cluster && options_.s3) {
      return Status::InvalidArgument("store: a RADOS cluster and an S3 bucket are both configured");
    }
    if (options_.s3) {
      CKPT_ASSIGN_OR_RETURN(backend_, NewS3Backend(db_.get(), families_, *options_.s3, s3_faults_));
    } else if (options_.cluster) {
#ifdef CKPT_WITH_RADOS
      CKPT_ASSIGN_OR_RETURN(backend_, NewRadosBackend(db_.get(), families_, *options_.cluster));
#else
      return Status::InvalidArgument(
          "store: a cluster is configured but this build has no RADOS support (CKPT_WITH_RADOS)");
#endif
    } else {
      backend_ = NewLocalBackend(db_.get(), families_.chunks, &health_, options_.sync_commits);
    }
    ctx_.backend = backend_.get();
    ctx_.cache = &cache_;
    ctx_.since_deltas = &since_deltas_;
    ctx_.codec = codec_.get();
    ctx_.options = &options_;
    ctx_.counters = &counters_;
    // With a cluster, recovery is the owner's business: interrupted pushes leave orphan chunks
    // that its garbage collection removes.
    if (backend_->IsLocal()) CKPT_RETURN_IF_ERROR(maintenance_.Recover());
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<UploadSpool> spool,
                          backend_->NewUploadSpool(options_.data_dir + "/uploads"));
    shards_go_to_the_writer_ = !backend_->IsLocal() && !spool->shared();
    return uploads_.Open(
        std::move(spool), [this](const std::string& model, uint64_t version) -> Result<bool> {
          std::string value;
          rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ctx_.versions,
                                       storage_keys::VersionKey(model, version), &value);
          if (s.IsNotFound()) return false;
          CKPT_RETURN_IF_ERROR(FromRocks(s, "reading a version"));
          return true;
        });
  }

  // A committed version as a shard sent again is compared with (nullopt: not committed).
  Result<std::optional<CommittedShards>> CommittedShardsOf(const std::string& model,
                                                           uint64_t version) {
    CKPT_ASSIGN_OR_RETURN(
        auto stored,
        ctx_.GetRecord<VersionRecord>(rocksdb::ReadOptions(), ctx_.versions,
                                      storage_keys::VersionKey(model, version), "version record"));
    if (!stored) return std::optional<CommittedShards>();
    CKPT_ASSIGN_OR_RETURN(const std::string layout_text, ShardLayoutOf(*stored));
    const auto layout = nlohmann::json::parse(layout_text, nullptr, false);
    CommittedShards c;
    c.info = MakeVersionInfo(model, version, *stored);
    c.shard_count = layout.is_object() ? layout.value("shards", 0u) : 0;
    if (layout.is_object() && layout.contains("shard_sha256")) {
      c.shard_sha256 = layout["shard_sha256"].get<std::vector<std::string>>();
    }
    return std::optional<CommittedShards>(std::move(c));
  }

  // The push of a sharded version's assembled body, once its model is free. The name is parsed
  // again: uploads spooled before a restart come back with the names read from the spool.
  // Checks a shard's index and its version's shard count.
  Status CheckShardIndex(uint32_t shard, uint32_t shard_count) const {
    if (shard_count == 0 || shard_count > options_.max_shards_per_version) {
      return Status::InvalidArgument(
          "a version has 1 to " + std::to_string(options_.max_shards_per_version) +
          " shards (storage.max_shards_per_version), not " + std::to_string(shard_count));
    }
    if (shard >= shard_count) {
      return Status::InvalidArgument("shard " + std::to_string(shard) +
                                     " is out of range: a version of " +
                                     std::to_string(shard_count) + " shards has shards 0 to " +
                                     std::to_string(shard_count - 1));
    }
    return Status::Ok();
  }

  Result<std::unique_ptr<PushSession>> BeginAssembledPush(const std::string& model,
                                                          uint64_t version, uint64_t body_size,
                                                          const PushOptions& options) {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return BeginPushSession(ctx_, writer_, name, version, body_size, options, kCommitLockWait);
  }

  Result<std::unique_ptr<PushSession>> BeginPush(std::string_view model, uint64_t version,
                                                 std::optional<uint64_t> body_size,
                                                 const PushOptions& options) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return BeginPushSession(ctx_, writer_, name, version, body_size, options);
  }

  Result<CodingPlan> PlanPush(std::string_view model, uint64_t version,
                              std::string_view raw_header) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return PlanPushOf(ctx_, writer_, name, version, raw_header);
  }

  Result<CodingPlan> PlanShard(std::string_view model, uint64_t version, uint32_t shard,
                               uint32_t shard_count, std::string_view raw_header) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    CKPT_RETURN_IF_ERROR(CheckShardIndex(shard, shard_count));
    CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header, ParseRawSafetensorsHeader(raw_header));
    CKPT_ASSIGN_OR_RETURN(const ShardHeader described, DescribeShard(shard, header));
    return PlanShardNow(name, version, described, shard_count);
  }

  // The plan of a shard, unless an earlier version's upload is in progress: its commit will be
  // this version's base, so a plan made now would be stale by then.
  Result<CodingPlan> PlanShardNow(const ModelName& name, uint64_t version, const ShardHeader& shard,
                                  uint32_t shard_count) {
    CKPT_ASSIGN_OR_RETURN(const std::optional<ModelRecord> record,
                          ctx_.GetRecord<ModelRecord>(rocksdb::ReadOptions(), ctx_.models,
                                                      name.str(), "model record"));
    const std::optional<uint64_t> latest = record && record->has_versions
                                               ? std::optional<uint64_t>(record->latest_version)
                                               : std::nullopt;
    if (auto pending = uploads_.UploadBetween(name.str(), latest, version)) {
      return Status::StalePlan("version " + std::to_string(*pending) + " of model '" + name.str() +
                               "' is being uploaded, and its commit will be the base "
                               "of version " +
                               std::to_string(version) +
                               ": send this shard once it is committed, or send it plain");
    }
    return PlanShardOf(ctx_, writer_, name, version, shard, shard_count);
  }

  bool CallWhenModelFree(std::string_view model, std::function<void()> on_free) override {
    // A sharded version's commit takes the model's lock only once its shards are assembled:
    // its end is awaited too, beside the lock's release (a waiter woken twice tries twice).
    const bool committing = uploads_.CallAfterCommit(std::string(model), on_free);
    const bool locked = writer_.CallOnRelease(model, std::move(on_free));
    return committing || locked;
  }

  Result<std::unique_ptr<RestoreStream>> OpenRestore(std::string_view model,
                                                     std::optional<uint64_t> version) override {
    return OpenRestore(model, version, RestoreSelection{});
  }

  Result<std::unique_ptr<RestoreStream>> OpenRestore(std::string_view model,
                                                     std::optional<uint64_t> version,
                                                     const RestoreSelection& selection) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const uint64_t cache_generation = cache_.generation();  // before the snapshot
    ScopedSnapshot snapshot(db_.get());
    CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ctx_, snapshot.reads(), model, version));
    auto& [number, record] = found;
    VersionInfo info = MakeVersionInfo(model, number, record);
    if (selection.whole()) {
      return OpenRestoreStream(ctx_, std::move(snapshot), std::string(model), std::move(info),
                               std::move(record), cache_generation, /*use_cache=*/true);
    }
    return OpenRestoreView(ctx_, std::move(snapshot), std::string(model), std::move(info),
                           std::move(record), cache_generation, selection);
  }

  Result<std::unique_ptr<RestoreStream>> OpenEncodedRestore(
      std::string_view model, std::optional<uint64_t> version, std::optional<uint64_t> since,
      const RestoreSelection& selection) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    if (selection.bytes) {
      return Status::InvalidArgument("an encoded pull sends whole chunks: it takes no byte range");
    }
    if (since && !selection.whole()) {
      return Status::InvalidArgument(
          "an encoded pull of a part of a version is sent whole: 'since' is for whole versions");
    }
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const uint64_t cache_generation = cache_.generation();  // before the snapshot
    ScopedSnapshot snapshot(db_.get());
    CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ctx_, snapshot.reads(), model, version));
    auto& [number, record] = found;
    uint64_t since_seq = 0;
    if (since) {
      CKPT_ASSIGN_OR_RETURN(auto held, FindVersion(ctx_, snapshot.reads(), model, *since));
      // A version that lost tensors restores to another body than its manifest's: the client's
      // copy cannot serve as those chains' base.
      if (held.second.dropped_tensors.empty()) since_seq = held.second.seq;
    }
    VersionInfo info = MakeVersionInfo(model, number, record);
    return OpenEncodedRestoreStream(ctx_, std::move(snapshot), std::string(model), std::move(info),
                                    std::move(record), cache_generation, since_seq,
                                    since.value_or(0), selection);
  }

  Result<std::string> GetShardLayout(std::string_view model,
                                     std::optional<uint64_t> version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ctx_, rocksdb::ReadOptions(), model, version));
    return ShardLayoutOf(found.second);
  }

  Result<std::unique_ptr<ShardSession>> BeginShard(std::string_view model, uint64_t version,
                                                   uint32_t shard, uint32_t shard_count,
                                                   std::optional<uint64_t> body_size,
                                                   const PushOptions& options) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(ValidatePushOptions(options));
    CKPT_RETURN_IF_ERROR(CheckShardIndex(shard, shard_count));
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->Refresh(name));
    rocksdb::ReadOptions ro;
    CKPT_ASSIGN_OR_RETURN(auto record,
                          ctx_.GetRecord<ModelRecord>(ro, ctx_.models, name, "model record"));
    CKPT_ASSIGN_OR_RETURN(std::optional<CommittedShards> committed,
                          CommittedShardsOf(name, version));
    if (committed) {
      // Sent again after the commit: compared with the shard the version was committed with.
    } else if (record && record->has_versions && version <= record->latest_version) {
      return Status::FailedPrecondition(
          "version " + std::to_string(version) + " must be greater than the latest version " +
          std::to_string(record->latest_version) + " of model '" + name + "'");
    } else {
      CKPT_RETURN_IF_ERROR(health_.CheckPush(body_size.value_or(0)));
    }
    return uploads_.Begin(name, version, shard, shard_count, body_size, options,
                          std::move(committed));
  }

  Result<ShardUploadInfo> GetUpload(std::string_view model, uint64_t version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    return uploads_.Get(std::string(model), version);
  }

  Result<std::vector<ShardUploadInfo>> ListUploads() override { return uploads_.List(); }

  Result<ShardResult> CommitUpload(std::string_view model, uint64_t version,
                                   const PushOptions& options) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(ValidatePushOptions(options));
    return uploads_.Commit(std::string(model), version, options);
  }

  Status AbortUpload(std::string_view model, uint64_t version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    return uploads_.Abort(std::string(model), version);
  }

  Result<std::vector<ShardUploadInfo>> ExpireUploads() override { return uploads_.Expire(NowMs()); }

  Result<std::vector<ModelInfo>> ListModels() override { return ListAllModels(ctx_); }

  Result<ModelInfo> GetModel(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(auto record, RequireModel(ctx_, rocksdb::ReadOptions(), model));
    return MakeModelInfo(model, record);
  }

  Result<std::vector<VersionInfo>> ListVersions(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const ScopedSnapshot snapshot(db_.get());
    return ListVersionsAt(ctx_, snapshot.reads(), model);
  }

  Result<VersionInfo> GetVersion(std::string_view model, std::optional<uint64_t> version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const ScopedSnapshot snapshot(db_.get());
    const rocksdb::ReadOptions ro = snapshot.reads();
    CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ctx_, ro, model, version));
    CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, ro, model));
    VersionInfo info = MakeVersionInfo(model, found.first, found.second);
    info.tags = std::move(tags[found.first]);
    return info;
  }

  Result<VersionDetail> GetVersionDetail(std::string_view model,
                                         std::optional<uint64_t> version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const ScopedSnapshot snapshot(db_.get());
    return VersionDetailAt(ctx_, snapshot.reads(), model, version);
  }

  Status DeleteVersion(std::string_view model, uint64_t version) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.DeleteVersion(name, version);
  }

  Status DeleteModel(std::string_view model) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    CKPT_RETURN_IF_ERROR(writer_.DeleteModel(name));
    return uploads_.RemoveModel(name.str());
  }

  Result<CodecPolicy> GetPolicy(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(ModelRecord record, RequireModel(ctx_, rocksdb::ReadOptions(), model));
    if (record.policy_json.empty()) return options_.default_policy;
    return CodecPolicy::FromJson(record.policy_json, options_.default_policy);
  }

  Status SetPolicy(std::string_view model, const CodecPolicy& policy) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.UpdateModelRecord(name, "setting policy",
                                     [&](ModelRecord& r) { r.policy_json = policy.ToJson(); });
  }

  Status SetTag(std::string_view model, std::string_view tag, uint64_t version) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.SetTag(name, tag, version);
  }

  Status RemoveTag(std::string_view model, std::string_view tag) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.RemoveTag(name, tag);
  }

  Result<uint64_t> ResolveTag(std::string_view model, std::string_view tag) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.ResolveTag(name, tag);
  }

  Result<RetentionPolicy> GetRetentionPolicy(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(ModelRecord record, RequireModel(ctx_, rocksdb::ReadOptions(), model));
    return writer_.RetentionOf(record);
  }

  Status SetRetentionPolicy(std::string_view model, const RetentionPolicy& policy) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.UpdateModelRecord(name, "setting retention policy",
                                     [&](ModelRecord& r) { r.retention_json = policy.ToJson(); });
  }

  Result<RetentionReport> ApplyRetention(std::string_view model, const RetentionRun& run) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.ApplyRetention(name, run);
  }

  Result<ScrubReport> Scrub(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    return maintenance_.Scrub(std::string(model));
  }

  Result<BackupResult> Backup(const std::string& backup_dir) override {
    return maintenance_.Backup(backup_dir);
  }

  Result<ModelCopyReport> CopyModelTo(std::string_view model,
                                      CheckpointStore& destination) override {
    auto* to = dynamic_cast<CheckpointStoreImpl*>(&destination);
    if (to == nullptr || to == this) {
      return Status::InvalidArgument("copy: the destination must be another store");
    }
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    // Checked before any lock or lease is taken: a model the destination holds is refused
    // without writing to either store (CopyModel checks again under the locks).
    CKPT_ASSIGN_OR_RETURN(const ModelInfo info, GetModel(model));
    if (to->GetModel(model).ok()) {
      return Status::FailedPrecondition("model '" + std::string(model) +
                                        "' exists in the destination: delete it there to copy it");
    }
    CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard source, writer_.LockForWrite(name));
    CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard target,
                          to->writer_.LockForPush(name, info.stored_bytes, {}));
    CKPT_RETURN_IF_ERROR(to->writer_.CheckModelLimit());
    return CopyModel(ctx_, to->ctx_, std::string(model));
  }

  Result<GcReport> CollectGarbage(std::string_view model, const GcOptions& options) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.CollectGarbage(name, options);
  }

  Result<RearrangeReport> RearrangeLatest(std::string_view model,
                                          const std::function<bool()>& cancelled) override {
    CKPT_ASSIGN_OR_RETURN(const ModelName name, ModelName::Parse(model));
    return writer_.RearrangeLatest(name, cancelled);
  }

  Result<std::optional<std::string>> WriteOwner(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    return backend_->WriteOwner(std::string(model));
  }

  bool ShardsGoToTheWriter() const override { return shards_go_to_the_writer_; }

  StoreStats Stats() override {
    StoreStats s;
    auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    s.pushes = get(counters_.pushes);
    s.push_raw_bytes = get(counters_.push_raw_bytes);
    s.push_stored_bytes = get(counters_.push_stored_bytes);
    s.encode_seconds = static_cast<double>(get(counters_.encode_ns)) * 1e-9;
    s.versions_deleted = get(counters_.versions_deleted);
    s.retention_versions_deleted = get(counters_.retention_versions_deleted);
    s.retention_tensors_dropped = get(counters_.retention_tensors_dropped);
    s.gc_bytes_freed = get(counters_.gc_bytes_freed);
    s.gc_versions_rebased = get(counters_.gc_versions_rebased);
    s.rearrangements = get(counters_.rearrangements);
    s.restores = get(counters_.restores);
    s.restore_links_decoded = get(counters_.restore_links_decoded);
    s.pull_chunks_coded = get(counters_.pull_chunks_coded);
    auto sum = [this](const std::string& property) {
      uint64_t total = 0;
      for (rocksdb::ColumnFamilyHandle* cf : families_.all) {
        uint64_t value = 0;
        if (db_->GetIntProperty(cf, property, &value)) total += value;
      }
      return total;
    };
    s.sst_bytes = sum(rocksdb::DB::Properties::kTotalSstFilesSize);
    s.blob_bytes = sum(rocksdb::DB::Properties::kTotalBlobFileSize);
    s.pending_compaction_bytes = sum(rocksdb::DB::Properties::kEstimatePendingCompactionBytes);
    uint64_t running = 0;
    if (db_->GetIntProperty(rocksdb::DB::Properties::kNumRunningCompactions, &running)) {
      s.running_compactions = running;
    }
    if (backend_->IsLocal()) AddSpace(&s);
    backend_->AddStats(&s);
    return s;
  }

  // StoreStats's account of the data directory's space; left unknown when the directory or
  // the models cannot be read.
  void AddSpace(StoreStats* s) {
    const std::optional<uint64_t> directory = DirectoryBytes(options_.data_dir);
    if (!directory) return;
    s->data_directory_bytes = *directory;
    auto models = ListModels();
    if (!models.ok()) return;
    for (const ModelInfo& m : *models) s->stored_bytes += m.stored_bytes;
    rocksdb::ColumnFamilyMetaData chunks;
    db_->GetColumnFamilyMetaData(families_.chunks, &chunks);
    for (const rocksdb::BlobMetaData& blob : chunks.blob_files) {
      s->garbage_bytes += blob.garbage_blob_bytes;
    }
    s->garbage_bytes += maintenance_.BytesAwaitingCompaction();
    const uint64_t accounted = s->stored_bytes + s->garbage_bytes;
    s->metadata_bytes = s->data_directory_bytes - std::min(s->data_directory_bytes, accounted);
    s->space_known = true;
  }

  StoreHealthReport Health() override { return health_.Report(); }

  Status Flush() override {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    CKPT_RETURN_IF_ERROR(FromRocks(db_->Flush(fo, families_.all), "flushing memtables"));
    return FromRocks(db_->FlushWAL(/*sync=*/true), "syncing WAL");
  }

 private:
  StoreOptions options_;
  const std::shared_ptr<rocksdb::Env> env_;           // null: the process's file system
  const std::shared_ptr<S3FaultInjector> s3_faults_;  // tests: faults of S3 requests
  ReferenceCache cache_;
  SinceDeltaCache since_deltas_;
  std::unique_ptr<TensorCodec> codec_;
  StoreHealth health_;  // the database's listener refers to it: declared before db_
  std::unique_ptr<rocksdb::DB> db_;
  StoreFamilies families_;
  std::unique_ptr<StoreBackend> backend_;
  bool shards_go_to_the_writer_ = false;  // set once by OpenDb
  StoreContext ctx_;                      // refers to the members above
  StoreCounters counters_;
  std::mutex tags_mu_;  // see StoreContext::tags_mu
  StoreMaintenance maintenance_;
  ModelWriter writer_;
  ShardedUploads uploads_;
};

}  // namespace

Status CheckpointStore::RestoreBackup(const std::string& backup_dir, const std::string& data_dir) {
  return StoreMaintenance::RestoreBackup(backup_dir, data_dir);
}

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(const StoreOptions& options) {
  return OpenStoreOn(options, nullptr);
}

Result<std::unique_ptr<CheckpointStore>> OpenStoreOn(const StoreOptions& options,
                                                     std::shared_ptr<rocksdb::Env> env,
                                                     std::shared_ptr<S3FaultInjector> s3_faults) {
  if (options.data_dir.empty()) return Status::InvalidArgument("store: data_dir is empty");
  if (options.chunk_bytes < 1024) {
    return Status::InvalidArgument("store: chunk_bytes must be at least 1024");
  }
  if (!options.create_if_missing) {
    std::error_code ec;
    if (!std::filesystem::is_directory(options.data_dir, ec)) {
      return Status::NotFound("no ckptd store in '" + options.data_dir +
                              "': the directory does not exist");
    }
    // Every RocksDB database has this file; a directory without it holds no store.
    if (!std::filesystem::exists(std::filesystem::path(options.data_dir) / "CURRENT", ec)) {
      return Status::NotFound("no ckptd store in '" + options.data_dir +
                              "': the directory holds no database");
    }
  }
  auto store = std::make_unique<CheckpointStoreImpl>(options, std::move(env), std::move(s3_faults));
  CKPT_RETURN_IF_ERROR(store->OpenDb());
  return std::unique_ptr<CheckpointStore>(std::move(store));
}

}  // namespace ckpt
