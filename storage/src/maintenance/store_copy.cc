// Copying a model between stores (store_copy.h).
#include "maintenance/store_copy.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "backends/model_records.h"
#include "chains/model_chains.h"
#include "engine/scoped_snapshot.h"
#include "records/records.h"

namespace ckpt {

Result<ModelCopyReport> CopyModel(const StoreContext& from, const StoreContext& to,
                                  const std::string& model) {
  const std::string what = "copying model '" + model + "'";
  CKPT_RETURN_IF_ERROR(from.backend->Refresh(model).WithContext(what));
  CKPT_RETURN_IF_ERROR(to.backend->Refresh(model).WithContext(what));
  CKPT_ASSIGN_OR_RETURN(auto existing,
                        to.GetRecord<ModelRecord>(rocksdb::ReadOptions(), to.models, model, what));
  if (existing) {
    return Status::FailedPrecondition("model '" + model +
                                      "' exists in the destination: delete it there to copy it");
  }
  const ScopedSnapshot snapshot(from.db);
  const rocksdb::ReadOptions ro = snapshot.reads();
  CKPT_ASSIGN_OR_RETURN(const ModelChains chains, ModelChains::Load(from, ro, model));
  ModelCopyReport report;
  report.model = model;
  report.versions = chains.versions.size();

  // The copy keeps the source's chunk addresses (model, seq, tensor, chunk). Where the
  // destination names objects by address, those it still holds may be a deleted model's, whose
  // removal another daemon runs minutes later: the copy's chunks would go with them. Where it
  // names every object afresh, they are left by a copy cut short or a deleted model, and are
  // collected once the copy committed.
  uint64_t held = 0;
  CKPT_RETURN_IF_ERROR(
      to.backend
          ->ForEachChunk(rocksdb::ReadOptions(), model, UINT64_MAX,
                         [&](uint64_t, uint32_t, uint32_t, std::string_view) { ++held; })
          .WithContext(what));
  if (held > 0 && !to.backend->WritesFreshChunkNames()) {
    return Status::FailedPrecondition(
        what + ": the destination still holds " + std::to_string(held) +
        " chunk records under the name (a model deleted there is removed within minutes; those "
        "of a copy that was cut short stay): copy it under this name once they are gone");
  }

  // The chunk records the manifests list; others (an interrupted push's) stay behind.
  uint64_t expected = 0, seq_end = 0;
  for (const auto& [seq, manifest] : chains.manifests) {
    for (const ManifestTensor& t : manifest.tensors) expected += t.chunk_count;
    seq_end = seq + 1;
  }
  // What a failed copy wrote goes again (best effort).
  auto discard = [&] {
    for (const auto& [seq, manifest] : chains.manifests) {
      to.backend->DiscardChunks(model, ChunkSet::Of(seq, manifest));
    }
  };
  Status written;
  CKPT_RETURN_IF_ERROR(
      from.backend
          ->ForEachChunk(
              ro, model, seq_end,
              [&](uint64_t seq, uint32_t tensor, uint32_t chunk, std::string_view value) {
                if (!written.ok()) return;
                auto m = chains.manifests.find(seq);
                if (m == chains.manifests.end() || tensor >= m->second.tensors.size() ||
                    chunk >= m->second.tensors[tensor].chunk_count) {
                  return;
                }
                written = to.backend->PutChunk(model, seq, tensor, chunk, value);
                ++report.chunks;
                report.bytes += value.size();
              })
          .WithContext(what));
  if (!written.ok()) {
    discard();
    return written.WithContext(what);
  }
  if (report.chunks != expected) {
    discard();
    return Status::DataLoss(what + ": the source holds " + std::to_string(report.chunks) +
                            " of the " + std::to_string(expected) +
                            " chunk records its versions need (scrub it)");
  }

  // Every record of the model, made visible by one commit once the chunks are durable.
  CKPT_ASSIGN_OR_RETURN(const RecordMap records, ModelRecords(from.db, from).CachedRecords(model));
  ModelChange change;
  change.refers_to_new_chunks = true;
  // Above every copied seq and the source's next one: the destination's writers allocate from a
  // higher epoch.
  change.foreign_seqs_end =
      std::max(seq_end, chains.codec_state ? chains.codec_state->next_seq : uint64_t{0});
  Status committed = ModelRecords(to.db, to).CacheBatch(model, records, &change.batch);
  if (committed.ok()) committed = to.backend->Commit(model, change, "copying the model");
  if (!committed.ok()) {
    discard();  // (a commit of unknown outcome keeps its chunks: the backend knows)
    return committed.WithContext(what);
  }
  if (held > 0) {
    // Orphans beside the copy, collected while its lock holds (best effort: garbage collection
    // of the model removes what stays).
    std::set<uint64_t> stored;
    for (const auto& [seq, manifest] : chains.manifests) stored.insert(seq);
    (void)to.backend->RemoveOrphanChunks(model, stored, change.foreign_seqs_end);
  }
  return report;
}

}  // namespace ckpt
