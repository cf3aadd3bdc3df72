#include "chains/garbage_collector.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "chains/chunk_copy.h"
#include "read/chain_reader.h"
#include "read/exact_reencode.h"
#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

namespace {

struct Link {
  uint64_t seq;
  uint32_t tensor;
};

// How one tensor of a kept manifest is rewritten.
struct TensorPlan {
  bool rebase = false;
  std::optional<Link> base;  // the nearest kept link of its old chain; none: keyframe
};

// The links of tensor `tensor`'s chain in manifest `seq`, nearest first (the manifest itself not
// included). The chains were validated by NeededSeqs.
std::vector<Link> ChainLinks(const ModelChains& chains, uint64_t seq, uint32_t tensor) {
  std::vector<Link> links;
  const ManifestTensor* e = &chains.manifests.at(seq).tensors[tensor];
  while (e->kind == FrameKind::kDelta && links.size() <= ChainReader::kMaxChainLinks) {
    links.push_back({e->base_seq, e->base_tensor});
    e = &chains.manifests.at(e->base_seq).tensors[e->base_tensor];
  }
  return links;
}

// Sum of the model's stored bytes: every manifest still stored.
uint64_t ModelStoredBytes(const ModelChains& chains) {
  uint64_t bytes = 0;
  for (const auto& [seq, m] : chains.manifests) bytes += m.stored_bytes;
  return bytes;
}

class Collector {
 public:
  Collector(const StoreContext& ctx, ModelChains& chains, const GcOptions& options)
      : ctx_(ctx), chains_(chains), options_(options) {
    report_.model = chains.model;
  }

  Result<GcReport> Run() {
    std::set<uint64_t> live = chains_.LiveSeqs();
    CKPT_ASSIGN_OR_RETURN(std::set<uint64_t> needed, chains_.NeededSeqs(live));
    std::set<uint64_t> dead;
    for (uint64_t seq : needed) {
      if (!live.count(seq)) dead.insert(seq);
    }
    const double dead_bytes = static_cast<double>(chains_.StoredBytes(dead));
    const double live_bytes = static_cast<double>(chains_.StoredBytes(live));
    if (!dead.empty() && options_.rebase_min_dead_fraction >= 0 &&
        dead_bytes > options_.rebase_min_dead_fraction * live_bytes) {
      CKPT_RETURN_IF_ERROR(RebaseKeptVersions(live));
      live = chains_.LiveSeqs();
      CKPT_ASSIGN_OR_RETURN(needed, chains_.NeededSeqs(live));
    }
    CKPT_RETURN_IF_ERROR(RemoveUnneeded(needed));
    CKPT_RETURN_IF_ERROR(RemoveDroppedTensors(live));
    for (uint64_t seq : needed) {
      if (!live.count(seq)) report_.bytes_retained += chains_.manifests.at(seq).stored_bytes;
    }
    return report_;
  }

 private:
  // Rebases, oldest first, each kept manifest with a tensor whose chain runs through dead data.
  // Oldest first: a rebased manifest is a clean base for the ones after it.
  Status RebaseKeptVersions(std::set<uint64_t> live) {
    const std::vector<uint64_t> order(live.begin(), live.end());
    // Rebases change a version's seq, never its dropped tensors: one map serves the pass.
    const std::map<uint64_t, const VersionRecord*> version_of = chains_.VersionsBySeq();
    for (uint64_t seq : order) {
      const ManifestRecord& m = chains_.manifests.at(seq);
      std::vector<TensorPlan> plan(m.tensors.size());
      std::set<uint64_t> crossed;  // the dead manifests this one's chains run through
      const auto owner = version_of.find(seq);
      for (uint32_t t = 0; t < m.tensors.size(); ++t) {
        // A dropped tensor is copied as it is: the chains that still run through it keep it,
        // RemoveDroppedTensors frees it once none does.
        if (owner != version_of.end() && owner->second->Dropped(t)) continue;
        for (const Link& link : ChainLinks(chains_, seq, t)) {
          if (live.count(link.seq)) {
            if (!plan[t].base) plan[t].base = link;
            break;  // a kept link's own chain is clean: it was handled before this one
          }
          plan[t].rebase = true;
          crossed.insert(link.seq);
        }
        if (!plan[t].rebase) plan[t].base.reset();
      }
      if (crossed.empty()) continue;
      if (options_.rebase_only_through && !crossed.count(*options_.rebase_only_through)) continue;
      CKPT_ASSIGN_OR_RETURN(const std::optional<uint64_t> new_seq,
                            Rebase(seq, plan, chains_.StoredBytes(crossed)));
      if (!new_seq) continue;
      live.erase(seq);
      live.insert(*new_seq);
    }
    return Status::Ok();
  }

  // Writes manifest `seq` anew under a fresh seq, re-encoding the planned tensors, and switches
  // every reference over in one synced batch that also removes what no version needs any more
  // (the old manifest, dead ones the rebase freed). Returns the new seq; nothing (and the chunks
  // written for it removed) when the rewrite would grow the manifest by at least
  // `freeable_bytes`, the stored bytes of the dead manifests its chains run through: then
  // keeping those is cheaper (lossy chains written without the lattice can be expensive to
  // re-encode exactly).
  Result<std::optional<uint64_t>> Rebase(uint64_t seq, const std::vector<TensorPlan>& plan,
                                         uint64_t freeable_bytes) {
    if (!chains_.codec_state) {
      return Status::Internal("model '" + chains_.model + "' has versions but no codec state");
    }
    CodecStateRecord state = *chains_.codec_state;
    const uint64_t new_seq = std::max(state.next_seq, ctx_.backend->SeqFloor(chains_.model));
    const ManifestRecord& old = chains_.manifests.at(seq);
    ManifestRecord rebased = old;
    ChainReader reader(ctx_.db, ctx_.manifests, ctx_.backend, nullptr, chains_.model, ctx_.cache);
    uint64_t tensor_bytes_before = 0, tensor_bytes_after = 0, rewritten = 0;
    std::vector<uint8_t> target, reference;
    // What the rebase writes under new_seq (the next push's seq until it commits) goes if the
    // writing fails: no record of it may meet the next writer of the seq.
    const auto write_rebased = [&]() -> Status {
      for (uint32_t t = 0; t < old.tensors.size(); ++t) {
        ManifestTensor& e = rebased.tensors[t];
        tensor_bytes_before += e.stored_bytes;
        if (!plan[t].rebase) {
          CKPT_RETURN_IF_ERROR(
              CopyTensorChunks(ctx_, chains_.model, seq, new_seq, t, e.chunk_count));
          if (e.keyframe_seq == seq) e.keyframe_seq = new_seq;
          tensor_bytes_after += e.stored_bytes;
          continue;
        }
        const std::optional<Link> base = plan[t].base;
        uint64_t stored = 0;
        double entropy_bits = 0;
        uint64_t exact_elements = 0;
        for (uint32_t c = 0; c < e.chunk_count; ++c) {
          CKPT_RETURN_IF_ERROR(reader.DecodeChunk(seq, t, c, &target));
          std::optional<std::span<const uint8_t>> ref;
          if (base) {
            CKPT_RETURN_IF_ERROR(reader.DecodeChunk(base->seq, base->tensor, c, &reference));
            ref = std::span<const uint8_t>(reference);
          }
          CKPT_ASSIGN_OR_RETURN(EncodedChunk encoded,
                                ReencodeExactly(ctx_, chains_.model, seq, t, c, e, target, ref));
          entropy_bits += encoded.info.model_entropy_bits;
          exact_elements += encoded.info.exact_elements;
          const std::string value = ChunkRecord::EncodeChunk(
              encoded, base ? FrameKind::kDelta : FrameKind::kKeyframe, target);
          CKPT_RETURN_IF_ERROR(ctx_.backend->PutChunk(chains_.model, new_seq, t, c, value)
                                   .WithContext("writing rebased chunk"));
          stored += value.size();
        }
        // A lossy tensor keeps its codec, quantizer and bound: it restores to the same bytes.
        e.entropy_bits = entropy_bits;
        e.exact_elements = exact_elements;
        e.stored_bytes = stored;
        if (base) {
          e.LinkTo(base->seq, base->tensor, chains_.manifests.at(base->seq).tensors[base->tensor]);
          e.chain_bytes += stored;
        } else {
          e.MakeKeyframe(new_seq, stored);
        }
        tensor_bytes_after += stored;
        rewritten += stored;
      }
      return Status::Ok();
    };
    if (Status written = write_rebased(); !written.ok()) {
      ctx_.backend->DiscardChunks(chains_.model, ChunkSet::Of(new_seq, rebased));
      return written;
    }
    if (tensor_bytes_after >= tensor_bytes_before + freeable_bytes) {
      ctx_.backend->DiscardChunks(chains_.model, ChunkSet::Of(new_seq, rebased));
      return std::optional<uint64_t>();
    }
    rebased.stored_bytes = old.stored_bytes - tensor_bytes_before + tensor_bytes_after;
    rebased.floor_seq = new_seq;
    for (const ManifestTensor& e : rebased.tensors) {
      rebased.floor_seq = std::min(rebased.floor_seq, e.keyframe_seq);
    }

    // The switch: the new manifest, every reference to the old one, the version, the state.
    ModelChange change;
    change.refers_to_new_chunks = true;
    rocksdb::WriteBatch& batch = change.batch;
    chains_.manifests.emplace(new_seq, std::move(rebased));
    for (auto& [other_seq, m] : chains_.manifests) {
      bool changed = false;
      for (ManifestTensor& e : m.tensors) {
        if (e.kind == FrameKind::kDelta && e.base_seq == seq) {
          e.base_seq = new_seq;
          changed = true;
        }
        if (e.keyframe_seq == seq) {
          e.keyframe_seq = new_seq;
          changed = true;
        }
      }
      if (changed || other_seq == new_seq) {
        batch.Put(ctx_.manifests, keys::ManifestKey(chains_.model, other_seq), Encoded(m));
      }
    }
    const ManifestRecord& written = chains_.manifests.at(new_seq);
    for (auto& [version, record] : chains_.versions) {
      if (record.seq != seq) continue;
      record.seq = new_seq;
      record.floor_seq = written.floor_seq;
      record.stored_bytes = written.stored_bytes;
      record.kind = VersionRecord::KindOf(written);
      batch.Put(ctx_.versions, keys::VersionKey(chains_.model, version), Encoded(record));
    }
    const bool was_reference = state.reference_seq == seq;
    if (was_reference) {
      state.reference_seq = new_seq;
      state.reference_floor_seq = written.floor_seq;
    }
    state.next_seq = new_seq + 1;
    chains_.codec_state = state;
    batch.Put(ctx_.codec_state, chains_.model, Encoded(state));
    // The old manifest, and the dead ones no chain runs through any more, go in the same batch:
    // between two rebases nothing is stored that no version needs.
    CKPT_ASSIGN_OR_RETURN(const ModelChains::Removal removal,
                          chains_.RemoveNoLongerNeeded(ctx_, &change));
    chains_.record.stored_bytes = ModelStoredBytes(chains_);
    batch.Put(ctx_.models, chains_.model, Encoded(chains_.record));
    CKPT_RETURN_IF_ERROR(ctx_.backend->Commit(chains_.model, change, "committing rebase"));
    report_.manifests_removed += removal.manifests;
    report_.bytes_freed += removal.bytes;
    ctx_.counters->gc_bytes_freed.fetch_add(removal.bytes, std::memory_order_relaxed);
    if (was_reference) ctx_.cache->Rekey(chains_.model, seq, new_seq);
    ++report_.versions_rebased;
    ctx_.counters->gc_versions_rebased.fetch_add(1, std::memory_order_relaxed);
    report_.bytes_rewritten += rewritten;
    return std::optional<uint64_t>(new_seq);
  }

  Status RemoveUnneeded(const std::set<uint64_t>& needed) {
    ModelChange change;
    const ModelChains::Removal removal = chains_.RemoveUnneeded(ctx_, needed, &change);
    if (removal.manifests == 0) return Status::Ok();
    for (auto it = chains_.manifests.begin(); it != chains_.manifests.end();) {
      it = needed.count(it->first) ? std::next(it) : chains_.manifests.erase(it);
    }
    chains_.record.stored_bytes = ModelStoredBytes(chains_);
    change.batch.Put(ctx_.models, chains_.model, Encoded(chains_.record));
    CKPT_RETURN_IF_ERROR(
        ctx_.backend->Commit(chains_.model, change, "removing unneeded manifests"));
    report_.manifests_removed += removal.manifests;
    report_.bytes_freed += removal.bytes;
    ctx_.counters->gc_bytes_freed.fetch_add(removal.bytes, std::memory_order_relaxed);
    return Status::Ok();
  }

  // Removes the chunks of the tensors that kept versions dropped (retention's tensor rules)
  // once no chain runs through them, and makes them chunkless in their manifests.
  Status RemoveDroppedTensors(const std::set<uint64_t>& live) {
    CKPT_ASSIGN_OR_RETURN(const std::set<ModelChains::TensorRef> needed,
                          chains_.NeededTensors(live));
    ModelChange change;
    uint64_t freed = 0;
    for (auto& [version, record] : chains_.versions) {
      if (record.dropped_tensors.empty()) continue;
      auto m = chains_.manifests.find(record.seq);
      if (m == chains_.manifests.end()) continue;  // NeededTensors checked the live ones
      ChunkSet removed{record.seq, std::vector<uint32_t>(m->second.tensors.size(), 0), true};
      uint64_t bytes = 0;
      for (uint32_t t : record.dropped_tensors) {
        if (t >= m->second.tensors.size()) continue;
        ManifestTensor& e = m->second.tensors[t];
        if (e.chunk_count == 0 || needed.count({record.seq, t})) continue;
        removed.chunk_counts[t] = e.chunk_count;
        bytes += e.stored_bytes;
        ++report_.dropped_tensors_removed;
        e.chunk_count = 0;
        e.stored_bytes = 0;
      }
      if (std::all_of(removed.chunk_counts.begin(), removed.chunk_counts.end(),
                      [](uint32_t c) { return c == 0; })) {
        continue;
      }
      m->second.stored_bytes -= std::min(m->second.stored_bytes, bytes);
      record.stored_bytes = m->second.stored_bytes;
      change.batch.Put(ctx_.manifests, keys::ManifestKey(chains_.model, record.seq),
                       Encoded(m->second));
      change.batch.Put(ctx_.versions, keys::VersionKey(chains_.model, version), Encoded(record));
      change.unreachable.push_back(std::move(removed));
      freed += bytes;
    }
    if (change.unreachable.empty()) return Status::Ok();
    chains_.record.stored_bytes = ModelStoredBytes(chains_);
    change.batch.Put(ctx_.models, chains_.model, Encoded(chains_.record));
    CKPT_RETURN_IF_ERROR(
        ctx_.backend->Commit(chains_.model, change, "removing dropped tensors' chunks"));
    report_.bytes_freed += freed;
    ctx_.counters->gc_bytes_freed.fetch_add(freed, std::memory_order_relaxed);
    return Status::Ok();
  }

  const StoreContext& ctx_;
  ModelChains& chains_;
  const GcOptions& options_;
  GcReport report_;
};

}  // namespace

Result<GcReport> CollectModelGarbage(const StoreContext& ctx, ModelChains& chains,
                                     const GcOptions& options) {
  return Collector(ctx, chains, options).Run();
}

}  // namespace ckpt
