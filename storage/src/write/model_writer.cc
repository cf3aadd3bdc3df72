// Changes of a model's metadata (model_writer.h).
#include "write/model_writer.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "chains/garbage_collector.h"
#include "chains/model_chains.h"
#include "chains/rearrange.h"
#include "chains/tensor_drop.h"
#include "read/catalog.h"
#include "records/keys.h"

namespace ckpt {
namespace {

namespace keys = storage_keys;

Status BusyModel(std::string_view model) {
  return Status::Aborted("model '" + std::string(model) +
                         "' is busy: a push to it is in progress; pushes to one model are "
                         "serialized, retry when it completes");
}

}  // namespace

Result<ModelLocks::Guard> ModelWriter::Lock(const ModelName& model,
                                            std::chrono::milliseconds wait) {
  ModelLocks::Guard guard = locks_.LockWithin(model, wait);
  if (!guard) return BusyModel(model);
  return guard;
}

Result<ModelLocks::Guard> ModelWriter::LockChecked(const ModelName& model,
                                                   std::chrono::milliseconds wait,
                                                   const std::function<Status()>& check_health) {
  CKPT_RETURN_IF_ERROR(check_health());
  CKPT_ASSIGN_OR_RETURN(ModelLocks::Guard guard, Lock(model, wait));
  if (wait.count() > 0) CKPT_RETURN_IF_ERROR(check_health());
  CKPT_RETURN_IF_ERROR(ctx_.backend->ClaimWrites(model.str()));
  return guard;
}

Result<ModelLocks::Guard> ModelWriter::LockForWrite(const ModelName& model,
                                                    std::chrono::milliseconds wait) {
  return LockChecked(model, wait, [&] { return ctx_.health->CheckWrite(); });
}

Result<ModelLocks::Guard> ModelWriter::LockForPush(const ModelName& model, uint64_t incoming_bytes,
                                                   std::chrono::milliseconds wait) {
  return LockChecked(model, wait, [&] { return ctx_.health->CheckPush(incoming_bytes); });
}

Status ModelWriter::CheckModelLimit() {
  const uint64_t max_models = ctx_.options->max_models;
  if (max_models == 0) return Status::Ok();
  std::unique_ptr<rocksdb::Iterator> it(ctx_.db->NewIterator(rocksdb::ReadOptions(), ctx_.models));
  uint64_t count = 0;
  for (it->SeekToFirst(); it->Valid() && count < max_models; it->Next()) ++count;
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "counting models"));
  if (count < max_models) return Status::Ok();
  return Status::FailedPrecondition("the store holds the maximum of " + std::to_string(max_models) +
                                    " models (storage.max_models): delete a model or raise "
                                    "the limit");
}

Result<RetentionPolicy> ModelWriter::RetentionOf(const ModelRecord& record) const {
  if (record.retention_json.empty()) return ctx_.options->default_retention;
  return RetentionPolicy::FromJson(record.retention_json);
}

Status ModelWriter::DeleteVersion(const ModelName& model, uint64_t version) {
  CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard guard, LockForWrite(model));
  const std::string name(model);
  std::unique_lock tags_lock(*ctx_.tags_mu);
  CKPT_ASSIGN_OR_RETURN(ModelChains chains, ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
  auto victim = chains.versions.find(version);
  if (victim == chains.versions.end()) {
    return Status::NotFound("model '" + name + "' has no version " + std::to_string(version));
  }
  CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, rocksdb::ReadOptions(), name));
  if (auto t = tags.find(version); t != tags.end()) {
    return Status::FailedPrecondition("model '" + name + "' version " + std::to_string(version) +
                                      " is tagged '" + t->second.front() +
                                      "' (pinned): remove its tags first");
  }
  ModelChange change;
  // The latest version goes: the next push deltas against the new latest instead (its
  // reconstruction is what a restore of it gives, so the closed loop holds), and the deleted
  // version's data is needed only as long as the remaining chains run through it.
  // A new latest that retention's tensor rules trimmed cannot be a reference (the next push
  // deltas against every tensor); the deleted one then stays the reference until the next push.
  const uint64_t victim_seq = victim->second.seq;
  std::optional<uint64_t> new_reference;
  if (chains.codec_state && chains.codec_state->reference_seq == victim_seq) {
    for (auto it = chains.versions.rbegin(); it != chains.versions.rend(); ++it) {
      if (it->first == version) continue;
      if (it->second.dropped_tensors.empty()) new_reference = it->second.seq;
      break;  // the newest version that stays
    }
  }
  if (new_reference) {
    chains.codec_state->reference_seq = *new_reference;
    change.batch.Put(ctx_.codec_state, name, Encoded(*chains.codec_state));
  }
  // Manifests still needed: those of the remaining versions and of the codec state's reference
  // (the next push deltas against it), with every link of their chains.
  CKPT_ASSIGN_OR_RETURN(auto needed, chains.NeededSeqs(chains.LiveSeqs(version)));
  change.batch.Delete(ctx_.versions, keys::VersionKey(name, version));
  const ModelChains::Removal removal = chains.RemoveUnneeded(ctx_, needed, &change);
  ModelRecord& record = chains.record;
  record.version_count -= 1;
  record.raw_bytes -= victim->second.raw_bytes;
  record.stored_bytes -= std::min(record.stored_bytes, removal.bytes);
  chains.versions.erase(victim);
  record.has_versions = !chains.versions.empty();
  record.latest_version = record.has_versions ? chains.versions.rbegin()->first : 0;
  change.batch.Put(ctx_.models, name, Encoded(record));
  CKPT_RETURN_IF_ERROR(ctx_.backend->Commit(name, change, "deleting version"));
  ctx_.counters->versions_deleted.fetch_add(1, std::memory_order_relaxed);
  // Its bytes leave the volume at the model's next compaction (gc reports them reclaimed).
  (void)maintenance_->MaybeCompact(name, removal.bytes, GcOptions::Compaction::kNone);
  if (!new_reference) return Status::Ok();
  // The old reference's reconstruction is no longer what the next push deltas against.
  ctx_.cache->DropModelExcept(name, *new_reference);
  // The deleted latest is usually the base the versions before it were re-encoded against
  // (RearrangeLatest): those are re-encoded now — usually one version, a push's worth of work —
  // so that its data leaves at once and the model holds no more than its versions need. Only
  // chains through the deleted version are touched. The delete is committed whatever happens
  // here: a reclaim that fails or is declined (a lossy re-encoding that would grow the store)
  // is left to the background pass that follows every delete, which reports its errors.
  tags_lock.unlock();
  auto reloaded = ModelChains::Load(ctx_, rocksdb::ReadOptions(), name);
  if (!reloaded.ok()) return Status::Ok();
  GcOptions reclaim;
  reclaim.rebase_min_dead_fraction = 0;
  reclaim.rebase_only_through = victim_seq;
  reclaim.compaction = GcOptions::Compaction::kNone;
  if (auto gc = CollectModelGarbage(ctx_, *reloaded, reclaim); gc.ok()) {
    (void)maintenance_->MaybeCompact(name, gc->bytes_freed, reclaim.compaction);
  }
  return Status::Ok();
}

Status ModelWriter::DeleteModel(const ModelName& model) {
  CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard guard, LockForWrite(model));
  const std::string name(model);
  std::lock_guard tags_lock(*ctx_.tags_mu);
  CKPT_RETURN_IF_ERROR(RequireModel(ctx_, rocksdb::ReadOptions(), model).status());
  ModelChange change;
  change.whole_model = true;
  change.batch.Delete(ctx_.models, name);
  change.batch.Delete(ctx_.codec_state, name);
  for (auto* cf : {ctx_.versions, ctx_.manifests, ctx_.tags}) {
    change.batch.DeleteRange(cf, keys::ModelPrefix(name), keys::ModelPrefixEnd(name));
  }
  if (!ctx_.backend->IsLocal()) {  // the local backend drops the model's whole chunk range
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
    for (const auto& [seq, manifest] : chains.manifests) {
      change.unreachable.push_back(ChunkSet::Of(seq, manifest));
    }
  }
  CKPT_RETURN_IF_ERROR(ctx_.backend->Commit(name, change, "deleting model"));
  maintenance_->ForgetModel(name);
  ctx_.cache->DropModelExcept(name, 0);
  return Status::Ok();
}

// Tags take no model lock (a tag can be set while a push runs): tags_mu orders them with the
// deletions and commits that must see them.
Status ModelWriter::SetTag(const ModelName& model, std::string_view tag, uint64_t version) {
  CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
  const std::string name(model);
  CKPT_RETURN_IF_ERROR(ctx_.health->CheckWrite());
  CKPT_RETURN_IF_ERROR(ctx_.backend->ClaimWrites(name));
  std::lock_guard tags_lock(*ctx_.tags_mu);
  CKPT_RETURN_IF_ERROR(FindVersion(ctx_, rocksdb::ReadOptions(), model, version).status());
  ModelChange change;
  change.batch.Put(ctx_.tags, keys::TagKey(model, tag), Encoded(TagRecord{version}));
  return ctx_.backend->Commit(name, change, "setting tag");
}

Status ModelWriter::RemoveTag(const ModelName& model, std::string_view tag) {
  CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
  const std::string name(model);
  CKPT_RETURN_IF_ERROR(ctx_.health->CheckWrite());
  CKPT_RETURN_IF_ERROR(ctx_.backend->ClaimWrites(name));
  std::lock_guard tags_lock(*ctx_.tags_mu);
  CKPT_RETURN_IF_ERROR(ResolveTag(model, tag).status());
  ModelChange change;
  change.batch.Delete(ctx_.tags, keys::TagKey(model, tag));
  return ctx_.backend->Commit(name, change, "removing tag");
}

Result<uint64_t> ModelWriter::ResolveTag(const ModelName& model, std::string_view tag) {
  CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
  CKPT_RETURN_IF_ERROR(ctx_.backend->Refresh(std::string(model)));
  std::string value;
  rocksdb::Status s =
      ctx_.db->Get(rocksdb::ReadOptions(), ctx_.tags, keys::TagKey(model, tag), &value);
  if (s.IsNotFound()) {
    CKPT_RETURN_IF_ERROR(RequireModel(ctx_, rocksdb::ReadOptions(), model).status());
    return Status::NotFound("model '" + std::string(model) + "' has no tag '" + std::string(tag) +
                            "'");
  }
  CKPT_RETURN_IF_ERROR(FromRocks(s, "reading tag"));
  CKPT_ASSIGN_OR_RETURN(const TagRecord record, TagRecord::DecodeFrom(value));
  return record.version;
}

Status ModelWriter::UpdateModelRecord(const ModelName& model, std::string_view what,
                                      const std::function<void(ModelRecord&)>& change) {
  CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard guard, LockForWrite(model));
  const std::string name(model);
  CKPT_ASSIGN_OR_RETURN(
      auto record,
      ctx_.GetRecord<ModelRecord>(rocksdb::ReadOptions(), ctx_.models, name, "model record"));
  if (!record) CKPT_RETURN_IF_ERROR(CheckModelLimit());
  ModelRecord updated = record.value_or(ModelRecord{});
  if (!record) updated.created_at_ms = NowMs();
  change(updated);
  ModelChange commit;
  commit.batch.Put(ctx_.models, name, Encoded(updated));
  return ctx_.backend->Commit(name, commit, what);
}

Result<RetentionReport> ModelWriter::ApplyRetention(const ModelName& model,
                                                    const RetentionRun& run) {
  const std::string name(model);
  RetentionReport report;
  report.model = name;
  report.dry_run = run.dry_run;
  {
    CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard guard, Lock(model, run.lock_wait));
    CKPT_RETURN_IF_ERROR(run.dry_run ? ctx_.backend->Refresh(name)
                                     : ctx_.backend->ClaimWrites(name));
    std::unique_lock tags_lock(*ctx_.tags_mu);
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
    CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, rocksdb::ReadOptions(), name));
    if (run.policy) {
      report.policy = *run.policy;
    } else {
      CKPT_ASSIGN_OR_RETURN(report.policy, RetentionOf(chains.record));
    }
    std::vector<RetentionCandidate> candidates;
    for (const auto& [version, record] : chains.versions) {
      RetentionCandidate c;
      c.version = version;
      c.created_at_ms = record.created_at_ms;
      c.stored_bytes = record.stored_bytes;
      c.metrics = record.metrics;
      if (auto t = tags.find(version); t != tags.end()) c.tags = t->second;
      candidates.push_back(std::move(c));
    }
    report.decisions =
        report.policy.Evaluate(std::move(candidates), run.now_ms != 0 ? run.now_ms : NowMs());
    for (const RetentionDecision& d : report.decisions) {
      if (!d.keep) report.deleted.push_back(d.version);
    }
    CKPT_ASSIGN_OR_RETURN(const auto drops, TensorsToDrop(chains, report));
    if (run.dry_run) return report;
    if (!report.deleted.empty()) {
      ModelChange change;
      for (uint64_t version : report.deleted) {
        auto it = chains.versions.find(version);
        change.batch.Delete(ctx_.versions, keys::VersionKey(name, version));
        chains.record.version_count -= 1;
        chains.record.raw_bytes -= it->second.raw_bytes;
        chains.versions.erase(it);
      }
      change.batch.Put(ctx_.models, name, Encoded(chains.record));
      CKPT_RETURN_IF_ERROR(ctx_.backend->Commit(name, change, "deleting versions by retention"));
      ctx_.counters->retention_versions_deleted.fetch_add(report.deleted.size(),
                                                          std::memory_order_relaxed);
    }
    tags_lock.unlock();
    CKPT_RETURN_IF_ERROR(DropTensors(chains, drops, report));
    CKPT_ASSIGN_OR_RETURN(report.gc, CollectModelGarbage(ctx_, chains, run.gc));
    CKPT_ASSIGN_OR_RETURN(report.gc.orphan_chunks_removed, maintenance_->RemoveOrphanChunks(name));
  }
  CKPT_ASSIGN_OR_RETURN(const uint64_t compacted,
                        maintenance_->MaybeCompact(name, report.gc.bytes_freed, run.gc.compaction));
  report.gc.compacted = compacted > 0;
  report.gc.bytes_reclaimed = compacted - std::min(compacted, report.gc.bytes_freed);
  return report;
}

Result<std::map<uint64_t, std::vector<uint32_t>>> ModelWriter::TensorsToDrop(
    const ModelChains& chains, RetentionReport& report) {
  std::map<uint64_t, std::vector<uint32_t>> drops;
  if (report.policy.tensor_rules.empty()) return drops;
  // The next push deltas against every tensor of its reference: that version keeps them all.
  const uint64_t reference = chains.codec_state ? chains.codec_state->reference_seq : 0;
  for (const RetentionDecision& d : report.decisions) {
    if (!d.keep || d.dropping_rules.empty()) continue;
    const VersionRecord& record = chains.versions.at(d.version);
    if (record.seq == reference) continue;
    auto m = chains.manifests.find(record.seq);
    if (m == chains.manifests.end()) {
      return Status::DataLoss("model '" + chains.model + "' version " + std::to_string(d.version) +
                              ": its manifest is missing");
    }
    for (uint32_t t = 0; t < m->second.tensors.size(); ++t) {
      const std::string& tensor = m->second.tensors[t].name;
      if (record.Dropped(t) || !report.policy.DropsTensor(d, tensor)) continue;
      drops[d.version].push_back(t);
      report.tensors_dropped[d.version].push_back(tensor);
    }
  }
  return drops;
}

Status ModelWriter::DropTensors(ModelChains& chains,
                                const std::map<uint64_t, std::vector<uint32_t>>& drops,
                                RetentionReport& report) {
  for (const auto& [version, tensors] : drops) {
    VersionRecord& record = chains.versions.at(version);
    // Restores the version to hash what remains: long, so without the tags lock, which is
    // taken again (and the version's tags read again) for the commit. A version that does not
    // restore keeps its tensors, and the pass goes on (scrub reports the damage).
    Result<VersionRecord> result = WithTensorsDropped(ctx_, chains.model, version, record,
                                                      chains.manifests.at(record.seq), tensors);
    if (!result.ok()) {
      report.tensors_dropped.erase(version);
      report.problems.push_back("version " + std::to_string(version) +
                                " keeps its tensors: " + result.status().message());
      continue;
    }
    VersionRecord dropped = std::move(result).value();
    std::lock_guard tags_lock(*ctx_.tags_mu);
    CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, rocksdb::ReadOptions(), chains.model));
    if (tags.count(version)) {  // tagged meanwhile: a tagged version keeps everything
      report.tensors_dropped.erase(version);
      continue;
    }
    chains.record.raw_bytes = chains.record.raw_bytes - record.raw_bytes + dropped.raw_bytes;
    ModelChange change;
    change.batch.Put(ctx_.versions, keys::VersionKey(chains.model, version), Encoded(dropped));
    change.batch.Put(ctx_.models, chains.model, Encoded(chains.record));
    CKPT_RETURN_IF_ERROR(
        ctx_.backend->Commit(chains.model, change, "dropping tensors by retention"));
    record = std::move(dropped);
    ctx_.counters->retention_tensors_dropped.fetch_add(tensors.size(), std::memory_order_relaxed);
  }
  return Status::Ok();
}

Result<GcReport> ModelWriter::CollectGarbage(const ModelName& model, const GcOptions& options) {
  const std::string name(model);
  GcReport report;
  {
    CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard guard, LockForWrite(model));
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
    CKPT_ASSIGN_OR_RETURN(report, CollectModelGarbage(ctx_, chains, options));
    CKPT_ASSIGN_OR_RETURN(report.orphan_chunks_removed, maintenance_->RemoveOrphanChunks(name));
  }
  // Outside the lock: pushes may proceed while the freed range is compacted.
  CKPT_ASSIGN_OR_RETURN(const uint64_t compacted,
                        maintenance_->MaybeCompact(name, report.bytes_freed, options.compaction));
  report.compacted = compacted > 0;
  report.bytes_reclaimed = compacted - std::min(compacted, report.bytes_freed);
  return report;
}

Result<RearrangeReport> ModelWriter::RearrangeLatest(const ModelName& model,
                                                     const std::function<bool()>& cancelled) {
  const std::string name(model);
  // The pass writes the latest version anew before the old encoding goes: like a push, it
  // stays out of the reserve.
  CKPT_RETURN_IF_ERROR(ctx_.health->CheckPush(0));
  ReplacedSeqs replaced;
  RearrangeReport report;
  Status status;
  bool reclaim_discarded = false;
  {
    CKPT_ASSIGN_OR_RETURN(const ModelLocks::Guard guard, LockForWrite(model));
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
    CodecPolicy policy = ctx_.options->default_policy;
    if (!chains.record.policy_json.empty()) {
      CKPT_ASSIGN_OR_RETURN(policy, CodecPolicy::FromJson(chains.record.policy_json, policy));
    }
    auto rearranged = ckpt::RearrangeLatest(
        ctx_, chains, policy.EffectiveKeyframeEvery(),
        [&] { return guard.Contended() || (cancelled && cancelled()); }, &replaced);
    if (!rearranged.ok()) {
      // What a pass that gave way to a push wrote went to files of its own (it sealed what
      // came before): compacting its seqs drops those the push's records do not share.
      // Outside the model's lock, so the push need not wait. Not after a storage error: a
      // compaction meeting a full volume is one the engine cannot be trusted to survive.
      // Nor when the store is stopping.
      reclaim_discarded = rearranged.status().code() == StatusCode::kAborted &&
                          !(cancelled && cancelled()) &&
                          replaced.discarded_end > replaced.discarded_begin;
      status = rearranged.status();
    } else {
      report = std::move(rearranged).value();
    }
  }
  if (!status.ok()) {
    if (reclaim_discarded) {
      (void)ctx_.backend->ReclaimRemovedChunks(name, replaced.discarded_begin,
                                               replaced.discarded_end);
    }
    return status;
  }
  if (report.tensors_keyframed > 0) {
    // The removed records share blob files only with records that died with them (the pass
    // wrote what lives on apart, and each push's commit sealed its own), so compacting their
    // key range drops those files whole, without copying anything; outside the model's lock, so
    // a push need not wait for it. Should it fail, the bytes await the model's next compaction
    // (the periodic pass's, or gc's), which reports them; nothing is lost either way.
    if (!ctx_.backend->ReclaimRemovedChunks(name, replaced.begin, replaced.end).ok()) {
      (void)maintenance_->MaybeCompact(name, replaced.bytes_removed, GcOptions::Compaction::kNone);
    }
  }
  // The pass ends a model's burst of writes: the journal goes too (best effort).
  (void)maintenance_->SettleJournal();
  return report;
}

}  // namespace ckpt
