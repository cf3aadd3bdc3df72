// The store's upkeep of its data (maintenance.h).
#include "maintenance/maintenance.h"

#include <rocksdb/transaction_log.h>
#include <rocksdb/utilities/backup_engine.h>
#include <rocksdb/write_batch.h>

#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include "chains/garbage_collector.h"
#include "chains/model_chains.h"
#include "engine/scoped_snapshot.h"
#include "read/catalog.h"
#include "read/restore_stream.h"
#include "records/keys.h"
#include "records/records.h"

namespace ckpt {

namespace keys = storage_keys;

Status StoreMaintenance::Recover() {
  CKPT_RETURN_IF_ERROR(LoadAwaitingCompaction());
  CKPT_RETURN_IF_ERROR(RemoveInterruptedPushes());
  return RemoveOrphanedManifests();
}

Status StoreMaintenance::LoadAwaitingCompaction() {
  std::unordered_map<std::string, uint64_t> loaded;
  std::vector<std::string> orphaned;  // counts of models deleted since (their range went whole)
  {
    std::unique_ptr<rocksdb::Iterator> it(
        ctx_.db->NewIterator(rocksdb::ReadOptions(), ctx_.db->DefaultColumnFamily()));
    const rocksdb::Slice prefix(keys::kAwaitingCompactionPrefix.data(),
                                keys::kAwaitingCompactionPrefix.size());
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      const std::string model = it->key().ToString().substr(prefix.size());
      std::string ignored;
      const rocksdb::Status exists =
          ctx_.db->Get(rocksdb::ReadOptions(), ctx_.models, model, &ignored);
      if (exists.IsNotFound()) {
        orphaned.push_back(model);
        continue;
      }
      CKPT_RETURN_IF_ERROR(FromRocks(exists, "reading model '" + model + "'"));
      // A count this build cannot read (written by a newer one) counts as nothing: it only
      // accounts for space, which the model's next compaction gives back either way.
      auto record = AwaitingCompactionRecord::DecodeFrom(it->value().ToStringView());
      if (record.ok()) loaded[model] = record->bytes;
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "reading the space awaiting compaction"));
  }
  std::lock_guard lock(freed_mu_);
  for (const std::string& model : orphaned) PersistAwaiting(model, 0);
  freed_since_compaction_ = std::move(loaded);
  return Status::Ok();
}

void StoreMaintenance::PersistAwaiting(const std::string& model, uint64_t bytes) {
  if (!ctx_.backend->IsLocal()) return;  // compactions are the local backend's
  const std::string key = keys::AwaitingCompactionKey(model);
  // Best effort: should the write fail, the count is lost at the next restart, not the data;
  // the model's next compaction still gives the space back.
  if (bytes == 0) {
    (void)ctx_.db->Delete(rocksdb::WriteOptions(), ctx_.db->DefaultColumnFamily(), key);
  } else {
    (void)ctx_.db->Put(rocksdb::WriteOptions(), ctx_.db->DefaultColumnFamily(), key,
                       Encoded(AwaitingCompactionRecord{bytes}));
  }
}

Result<ScrubReport> StoreMaintenance::Scrub(const std::string& model) {
  CKPT_RETURN_IF_ERROR(ctx_.backend->Refresh(model));
  const ScopedSnapshot snapshot(ctx_.db);
  rocksdb::ReadOptions ro = snapshot.reads();
  ro.verify_checksums = true;
  return ScrubAt(ro, model);
}

Result<ScrubReport> StoreMaintenance::ScrubAt(const rocksdb::ReadOptions& ro,
                                              const std::string& name) {
  ScrubReport report;
  report.model = name;
  CKPT_ASSIGN_OR_RETURN(ModelChains chains, ModelChains::Load(ctx_, ro, name));
  // Data at or beyond next_seq belongs to a push or rebase still in progress.
  const uint64_t next_seq = chains.codec_state ? chains.codec_state->next_seq : 1;
  std::set<uint64_t> needed;
  if (auto n = chains.NeededSeqs(chains.LiveSeqs()); n.ok()) {
    needed = std::move(*n);
  } else {
    report.problems.push_back(n.status().message());
  }
  for (const auto& [seq, manifest] : chains.manifests) {
    if (!needed.count(seq) && seq < next_seq) ++report.orphaned_manifests;
  }
  // Every chunk record: its payload checksum, and that it belongs to a stored push.
  Status listed = ctx_.backend->ForEachChunk(
      ro, name, next_seq,
      [&](uint64_t seq, uint32_t tensor, uint32_t chunk, std::string_view value) {
        auto manifest = chains.manifests.find(seq);
        if (manifest == chains.manifests.end()) {
          ++report.orphaned_chunks;
          return;
        }
        ++report.chunks_checked;
        report.bytes_checked += value.size();
        auto record = ChunkRecord::DecodeFrom(value);
        if (!record.ok()) {
          report.problems.push_back("stored push of version " +
                                    std::to_string(manifest->second.version) + " tensor " +
                                    std::to_string(tensor) + " chunk " + std::to_string(chunk) +
                                    ": " + record.status().message());
        }
      });
  if (!listed.ok()) report.problems.push_back(listed.message());
  // Every version restored in full: chain links, decoded checksums, the body's SHA-256.
  for (const auto& entry : chains.versions) {
    const uint64_t version = entry.first;  // named: lambdas below capture it
    // A fresh snapshot per version (a stream owns its snapshot); a version deleted since the
    // listing is skipped.
    ScopedSnapshot snapshot(ctx_.db);
    auto found = FindVersion(ctx_, snapshot.reads(), name, version);
    if (!found.ok() && found.status().code() == StatusCode::kNotFound) continue;
    ++report.versions_checked;
    Status restored = [&]() -> Status {
      CKPT_RETURN_IF_ERROR(found.status());
      const VersionRecord& record = found->second;
      CKPT_ASSIGN_OR_RETURN(
          auto stream,
          OpenRestoreStream(ctx_, std::move(snapshot), name, MakeVersionInfo(name, version, record),
                            record, ReferenceCache::kAnyGeneration, /*use_cache=*/false));
      for (;;) {
        CKPT_ASSIGN_OR_RETURN(auto piece, stream->Next());
        if (piece.empty()) return Status::Ok();
      }
    }();
    if (!restored.ok()) {
      report.damaged_versions.push_back(version);
      report.problems.push_back(restored.message());
    }
  }
  return report;
}

Result<BackupResult> StoreMaintenance::Backup(const std::string& backup_dir) {
  if (backup_dir.empty()) return Status::InvalidArgument("backup: directory is empty");
  if (!ctx_.backend->IsLocal()) {
    return Status::FailedPrecondition("backup: the data is in " + ctx_.backend->Location() +
                                      " (the data directory is only a cache); back it up with "
                                      "the object store's own tools");
  }
  // The backup directory and its parents are created as needed; a path that cannot be made is
  // the caller's mistake (a file in the way, no permission), named as given.
  std::error_code ec;
  std::filesystem::create_directories(backup_dir, ec);
  if (ec || !std::filesystem::is_directory(backup_dir, ec)) {
    return Status::InvalidArgument("backup: cannot create the backup directory '" + backup_dir +
                                   "'" + (ec ? ": " + ec.message() : ": a file is in the way"));
  }
  rocksdb::BackupEngine* raw = nullptr;
  CKPT_RETURN_IF_ERROR(
      FromRocks(rocksdb::BackupEngine::Open(rocksdb::BackupEngineOptions(backup_dir),
                                            rocksdb::Env::Default(), &raw),
                "opening backup directory '" + backup_dir + "'"));
  std::unique_ptr<rocksdb::BackupEngine> engine(raw);
  rocksdb::CreateBackupOptions create;
  rocksdb::BackupID id = 0;
  CKPT_RETURN_IF_ERROR(FromRocks(engine->CreateNewBackupWithMetadata(create, ctx_.db, "ckptd", &id),
                                 "creating backup"));
  CKPT_RETURN_IF_ERROR(FromRocks(engine->VerifyBackup(id, /*verify_with_checksum=*/true),
                                 "verifying backup " + std::to_string(id)));
  rocksdb::BackupInfo info;
  CKPT_RETURN_IF_ERROR(FromRocks(engine->GetBackupInfo(id, &info), "reading backup info"));
  BackupResult result;
  result.dir = backup_dir;
  result.backup_id = id;
  result.created_at_ms = info.timestamp * 1000;
  result.size_bytes = info.size;
  result.files = info.number_files;
  return result;
}

Status StoreMaintenance::RestoreBackup(const std::string& backup_dir, const std::string& data_dir) {
  if (backup_dir.empty() || data_dir.empty()) {
    return Status::InvalidArgument("restore-backup: backup and data directories are required");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(backup_dir, ec)) {
    return Status::NotFound("restore-backup: backup directory '" + backup_dir + "' does not exist");
  }
  if (std::filesystem::exists(data_dir, ec) && !std::filesystem::is_empty(data_dir, ec)) {
    return Status::FailedPrecondition("restore-backup: data directory '" + data_dir +
                                      "' is not empty; restore into a new directory");
  }
  rocksdb::BackupEngineReadOnly* raw = nullptr;
  CKPT_RETURN_IF_ERROR(
      FromRocks(rocksdb::BackupEngineReadOnly::Open(rocksdb::BackupEngineOptions(backup_dir),
                                                    rocksdb::Env::Default(), &raw),
                "opening backup directory '" + backup_dir + "'"));
  std::unique_ptr<rocksdb::BackupEngineReadOnly> engine(raw);
  std::vector<rocksdb::BackupInfo> backups;
  engine->GetBackupInfo(&backups);
  if (backups.empty()) {
    return Status::NotFound("restore-backup: no backup in '" + backup_dir + "'");
  }
  return FromRocks(engine->RestoreDBFromLatestBackup(data_dir, data_dir),
                   "restoring backup into '" + data_dir + "'");
}

Result<uint64_t> StoreMaintenance::RemoveOrphanChunks(const std::string& model) {
  if (ctx_.backend->IsLocal()) return uint64_t{0};
  CKPT_ASSIGN_OR_RETURN(ModelChains chains, ModelChains::Load(ctx_, rocksdb::ReadOptions(), model));
  std::set<uint64_t> stored;
  for (const auto& [seq, manifest] : chains.manifests) stored.insert(seq);
  const uint64_t next_seq = chains.codec_state ? chains.codec_state->next_seq : 1;
  return ctx_.backend->RemoveOrphanChunks(model, stored,
                                          std::max(next_seq, ctx_.backend->SeqFloor(model)));
}

Result<uint64_t> StoreMaintenance::MaybeCompact(const std::string& model, uint64_t freed,
                                                GcOptions::Compaction compaction) {
  uint64_t compacted = 0;
  uint64_t recorded = 0;  // what the model's record holds (0: it has none)
  {
    std::lock_guard lock(freed_mu_);
    uint64_t& pending = freed_since_compaction_[model];
    pending += freed;
    // Written before the compaction too: a crash while it runs keeps the count.
    if (freed > 0) PersistAwaiting(model, pending);
    recorded = pending;
    if (compaction == GcOptions::Compaction::kNone || pending == 0 || !ctx_.backend->IsLocal()) {
      return uint64_t{0};
    }
    std::swap(compacted, pending);
  }
  const Status status = CompactModelChunks(model, compaction == GcOptions::Compaction::kFull);
  std::lock_guard lock(freed_mu_);
  auto entry = freed_since_compaction_.find(model);
  // The model was deleted meanwhile (ForgetModel): its whole range goes, nothing awaits.
  if (entry == freed_since_compaction_.end()) {
    CKPT_RETURN_IF_ERROR(status);
    return compacted;
  }
  uint64_t& pending = entry->second;
  // A failed compaction gave nothing back: its bytes await the next one. Bytes freed while it
  // ran await the next one too.
  if (!status.ok()) pending += compacted;
  if (pending != 0 || recorded != 0) PersistAwaiting(model, pending);
  CKPT_RETURN_IF_ERROR(status);
  return compacted;
}

uint64_t StoreMaintenance::BytesAwaitingCompaction() const {
  std::lock_guard lock(freed_mu_);
  uint64_t total = 0;
  for (const auto& [model, bytes] : freed_since_compaction_) total += bytes;
  return total;
}

void StoreMaintenance::ForgetModel(const std::string& model) {
  std::lock_guard lock(freed_mu_);
  // A record left by a crash before this point goes at the next open (no model record).
  if (freed_since_compaction_.erase(model) > 0) PersistAwaiting(model, 0);
}

Status StoreMaintenance::SettleJournal() {
  // Below this much log, a flush would only add table files (every pass calls this, the
  // periodic ones on idle models too).
  constexpr uint64_t kSettledLogBytes = 1 << 20;
  rocksdb::VectorLogPtr logs;
  CKPT_RETURN_IF_ERROR(FromRocks(ctx_.db->GetSortedWalFiles(logs), "listing the log files"));
  uint64_t log_bytes = 0;
  for (const auto& log : logs) log_bytes += log->SizeFileBytes();
  if (log_bytes < kSettledLogBytes) return Status::Ok();
  // The default family holds the counts of space awaiting compaction.
  std::vector<rocksdb::ColumnFamilyHandle*> families = {ctx_.db->DefaultColumnFamily(),
                                                        ctx_.models,
                                                        ctx_.versions,
                                                        ctx_.manifests,
                                                        ctx_.codec_state,
                                                        ctx_.tags};
  if (ctx_.chunks != nullptr) families.push_back(ctx_.chunks);
  rocksdb::FlushOptions flush;
  flush.allow_write_stall = true;
  return FromRocks(ctx_.db->Flush(flush, families), "flushing the store's families");
}

// Rewrites the model's chunk key range, dropping deleted entries (blob files left holding only
// deleted data go with them); `force_blob_gc` also moves the blobs still referenced out of blob
// files that hold garbage, so that those are removed too.
Status StoreMaintenance::CompactModelChunks(const std::string& model, bool force_blob_gc) {
  rocksdb::CompactRangeOptions cro;
  // Collecting blob garbage copies live payloads before their old files go: it needs room for
  // up to every blob file of the family. Without that room (a nearly full volume) the
  // compaction only drops what is deleted, and blob files no live record refers to with it.
  uint64_t blob_bytes = 0;
  ctx_.db->GetIntProperty(ctx_.chunks, rocksdb::DB::Properties::kTotalBlobFileSize, &blob_bytes);
  if (!ctx_.health->RoomFor(blob_bytes)) {
    cro.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
  } else if (force_blob_gc) {
    cro.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
    cro.blob_garbage_collection_age_cutoff = 1.0;
  }
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  const std::string begin = keys::ModelPrefix(model), end = keys::ModelPrefixEnd(model);
  const rocksdb::Slice begin_slice(begin), end_slice(end);
  return FromRocks(ctx_.db->CompactRange(cro, ctx_.chunks, &begin_slice, &end_slice),
                   "compacting chunks of model '" + model + "'");
}

// Recovery, second part: manifests no version needs. Every commit removes those it makes
// unneeded (pushes, deletions, rebases, rearrangements), so this finds some only in a store
// whose writer did not; they are removed. A model whose records cannot be read is left alone
// for the scrub to report.
Status StoreMaintenance::RemoveOrphanedManifests() {
  std::vector<std::string> models;
  {
    std::unique_ptr<rocksdb::Iterator> it(
        ctx_.db->NewIterator(rocksdb::ReadOptions(), ctx_.models));
    for (it->SeekToFirst(); it->Valid(); it->Next()) models.push_back(it->key().ToString());
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing models for recovery"));
  }
  GcOptions sweep;
  sweep.rebase_min_dead_fraction = -1;
  sweep.compaction = GcOptions::Compaction::kNone;
  for (const std::string& model : models) {
    auto chains = ModelChains::Load(ctx_, rocksdb::ReadOptions(), model);
    if (!chains.ok()) continue;
    // A model that cannot be swept is left for the scrub to report.
    (void)CollectModelGarbage(ctx_, *chains, sweep);
  }
  return Status::Ok();
}

// Recovery: chunks written by a push or a garbage-collection rebase that never committed
// (crash, kill -9) lie at or beyond their model's committed next_seq. Removes them, then
// compacts each model's chunk range so that their bytes leave the disk now rather than at some
// later compaction: the table files that referred to them are rewritten, and blob files left
// holding only their payloads are deleted with them.
Status StoreMaintenance::RemoveInterruptedPushes() {
  rocksdb::ReadOptions ro;
  std::unique_ptr<rocksdb::Iterator> it(ctx_.db->NewIterator(ro, ctx_.chunks));
  rocksdb::WriteBatch batch;
  std::vector<std::string> interrupted;
  for (it->SeekToFirst(); it->Valid();) {
    std::string_view key = it->key().ToStringView();
    const size_t sep = key.find('\0');
    if (sep == std::string_view::npos) {
      return Status::DataLoss("chunk key without model separator");
    }
    const std::string model(key.substr(0, sep));
    CKPT_ASSIGN_OR_RETURN(
        auto state, ctx_.GetRecord<CodecStateRecord>(ro, ctx_.codec_state, model, "codec state"));
    const uint64_t next_seq = state ? state->next_seq : 1;
    it->Seek(keys::ChunkSeqBegin(model, next_seq));
    if (it->Valid() && it->key().starts_with(keys::ModelPrefix(model))) {
      batch.DeleteRange(ctx_.chunks, keys::ChunkSeqBegin(model, next_seq),
                        keys::ModelPrefixEnd(model));
      interrupted.push_back(model);
    }
    it->Seek(keys::ModelPrefixEnd(model));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunks for recovery"));
  if (batch.Count() == 0) return Status::Ok();
  rocksdb::WriteOptions wo;
  wo.sync = true;
  CKPT_RETURN_IF_ERROR(FromRocks(ctx_.db->Write(wo, &batch), "removing interrupted pushes"));
  for (const std::string& model : interrupted) {
    CKPT_RETURN_IF_ERROR(CompactModelChunks(model, /*force_blob_gc=*/false));
  }
  return Status::Ok();
}

}  // namespace ckpt
