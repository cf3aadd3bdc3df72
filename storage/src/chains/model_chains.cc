#include "chains/model_chains.h"

#include <memory>
#include <vector>

#include "read/chain_reader.h"
#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

namespace {

// Decodes every record under the model's prefix in `cf`, keyed by the number after the prefix.
template <typename Record>
Status LoadNumbered(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                    rocksdb::ColumnFamilyHandle* cf, const std::string& model,
                    std::string_view what, std::map<uint64_t, Record>* out) {
  std::unique_ptr<rocksdb::Iterator> it(ctx.db->NewIterator(ro, cf));
  const std::string prefix = keys::ModelPrefix(model);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const uint64_t number = keys::NumberAfterPrefix(it->key().ToStringView(), model.size());
    auto record = Record::DecodeFrom(it->value().ToStringView());
    if (!record.ok()) {
      return record.status().WithContext("model '" + model + "' " + std::string(what) + " " +
                                         std::to_string(number));
    }
    out->emplace(number, std::move(record).value());
  }
  return FromRocks(it->status(), "listing " + std::string(what) + "s of model '" + model + "'");
}

}  // namespace

Result<ModelChains> ModelChains::Load(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                                      const std::string& model) {
  ModelChains chains;
  chains.model = model;
  CKPT_ASSIGN_OR_RETURN(auto record,
                        ctx.GetRecord<ModelRecord>(ro, ctx.models, model, "model record"));
  if (!record) return Status::NotFound("model '" + model + "' not found");
  chains.record = std::move(*record);
  CKPT_ASSIGN_OR_RETURN(chains.codec_state,
                        ctx.GetRecord<CodecStateRecord>(ro, ctx.codec_state, model, "codec state"));
  CKPT_RETURN_IF_ERROR(LoadNumbered(ctx, ro, ctx.versions, model, "version", &chains.versions));
  CKPT_RETURN_IF_ERROR(LoadNumbered(ctx, ro, ctx.manifests, model, "manifest", &chains.manifests));
  return chains;
}

std::set<uint64_t> ModelChains::LiveSeqs(std::optional<uint64_t> excluded_version) const {
  std::set<uint64_t> live;
  for (const auto& [version, version_record] : versions) {
    if (version != excluded_version) live.insert(version_record.seq);
  }
  if (codec_state) live.insert(codec_state->reference_seq);
  return live;
}

Result<std::set<ModelChains::TensorRef>> ModelChains::NeededTensors(
    const std::set<uint64_t>& live) const {
  const std::map<uint64_t, const VersionRecord*> version_of = VersionsBySeq();
  const uint64_t reference = codec_state ? codec_state->reference_seq : 0;
  // Each (seq, tensor) link is followed once however many chains share it.
  std::set<TensorRef> walked;
  for (const uint64_t seq : live) {
    auto m = manifests.find(seq);
    if (m == manifests.end()) {
      return Status::DataLoss("model '" + model + "': live manifest " + std::to_string(seq) +
                              " is missing");
    }
    auto owner = version_of.find(seq);
    for (uint32_t tensor = 0; tensor < m->second.tensors.size(); ++tensor) {
      // The next push deltas against every tensor of the reference, dropped or not.
      if (seq != reference && owner != version_of.end() && owner->second->Dropped(tensor)) continue;
      uint64_t s = seq;
      uint32_t t = tensor;
      for (size_t links = 0;; ++links) {
        if (!walked.emplace(s, t).second) break;
        auto link = manifests.find(s);
        if (link == manifests.end()) {
          return Status::DataLoss("model '" + model + "': delta chain reaches missing manifest " +
                                  std::to_string(s));
        }
        if (t >= link->second.tensors.size()) {
          return Status::DataLoss("model '" + model + "' manifest " + std::to_string(s) +
                                  ": delta base tensor index out of range");
        }
        const ManifestTensor& e = link->second.tensors[t];
        if (e.kind == FrameKind::kKeyframe) break;
        if (links > ChainReader::kMaxChainLinks) {
          return Status::DataLoss("model '" + model + "': delta chain of tensor '" + e.name +
                                  "' is cyclic");
        }
        s = e.base_seq;
        t = e.base_tensor;
      }
    }
  }
  return walked;
}

Result<std::set<uint64_t>> ModelChains::NeededSeqs(const std::set<uint64_t>& live) const {
  CKPT_ASSIGN_OR_RETURN(const std::set<TensorRef> tensors, NeededTensors(live));
  std::set<uint64_t> needed = live;
  for (const auto& [seq, tensor] : tensors) needed.insert(seq);
  return needed;
}

ModelChains::Removal ModelChains::RemoveUnneeded(const StoreContext& ctx,
                                                 const std::set<uint64_t>& needed,
                                                 ModelChange* change) const {
  Removal removal;
  for (const auto& [seq, manifest] : manifests) {
    if (needed.count(seq)) continue;
    ++removal.manifests;
    removal.bytes += manifest.stored_bytes;
    change->batch.Delete(ctx.manifests, keys::ManifestKey(model, seq));
    change->unreachable.push_back(ChunkSet::Of(seq, manifest));
  }
  return removal;
}

Result<ModelChains::Removal> ModelChains::RemoveNoLongerNeeded(const StoreContext& ctx,
                                                               ModelChange* change) {
  CKPT_ASSIGN_OR_RETURN(const std::set<uint64_t> needed, NeededSeqs(LiveSeqs()));
  const Removal removal = RemoveUnneeded(ctx, needed, change);
  std::erase_if(manifests, [&](const auto& entry) { return !needed.count(entry.first); });
  return removal;
}

std::map<uint64_t, const VersionRecord*> ModelChains::VersionsBySeq() const {
  std::map<uint64_t, const VersionRecord*> by_seq;
  for (const auto& [version, v] : versions) by_seq.emplace(v.seq, &v);
  return by_seq;
}

uint64_t ModelChains::StoredBytes(const std::set<uint64_t>& seqs) const {
  uint64_t bytes = 0;
  for (const uint64_t seq : seqs) {
    if (auto it = manifests.find(seq); it != manifests.end()) bytes += it->second.stored_bytes;
  }
  return bytes;
}

}  // namespace ckpt
