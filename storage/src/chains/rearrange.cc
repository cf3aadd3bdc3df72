#include "chains/rearrange.h"

#include <rocksdb/slice.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chains/chunk_copy.h"
#include "ckpt/codec/lossy_codec.h"
#include "read/chain_reader.h"
#include "read/exact_reencode.h"
#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

namespace {

// A tensor is rearranged when its exact re-encodings cost at most this much more than the
// payloads they replace: lossless XOR deltas are symmetric, and lattice reconstructions that do
// not depend on their chain re-encode at the cost of a forward delta, so both pass easily;
// chains whose reconstructions carry their history (element-history bits, low-rank shifts)
// cost several times more backwards and stay forward.
constexpr double kSlack = 1.03;
// While a tensor is being re-encoded, it is given up as soon as its bytes so far exceed the
// budget's share of what it has covered by this factor (its first chunks show it).
constexpr double kEarlySlack = 1.25;
// Keyframes measured while the reverse deltas are written are kept for writing up to this many
// bytes, so that small models (and the keyframes of lossy ones, which are small) are encoded
// once; beyond it they are encoded again rather than held, which bounds the pass's memory.
constexpr uint64_t kKeptKeyframeBytes = 32ull << 20;

using Link = std::pair<uint64_t, uint32_t>;        // (manifest seq, tensor index)
using ChunkIndex = std::pair<uint32_t, uint32_t>;  // (tensor index, chunk index)

// A tensor of the previous version re-encoded as a delta against the latest's keyframe.
struct Reversal {
  uint32_t latest_tensor = 0;
  uint64_t stored_bytes = 0;
  double entropy_bits = 0;
  uint64_t exact_elements = 0;
};

class Rearranger {
 public:
  Rearranger(const StoreContext& ctx, ModelChains& chains, uint32_t max_decodes,
             const std::function<bool()>& yield, ReplacedSeqs* replaced)
      : ctx_(ctx), chains_(chains), max_decodes_(max_decodes), yield_(yield), replaced_(replaced) {
    report_.model = chains.model;
    *replaced_ = ReplacedSeqs{};
  }

  Result<RearrangeReport> Run() {
    if (!chains_.codec_state) return report_;
    latest_seq_ = chains_.codec_state->reference_seq;
    auto latest = chains_.manifests.find(latest_seq_);
    if (latest == chains_.manifests.end()) return report_;
    // The forward deltas of the latest version, against the manifest its first delta uses (all
    // of them but after a garbage collection rebased part of the version before).
    for (const ManifestTensor& e : latest->second.tensors) {
      if (e.kind == FrameKind::kDelta) {
        prev_seq_ = e.base_seq;
        break;
      }
    }
    if (prev_seq_ == 0) return report_;
    auto prev = chains_.manifests.find(prev_seq_);
    if (prev == chains_.manifests.end()) {
      return Status::DataLoss("model '" + chains_.model + "': delta base manifest " +
                              std::to_string(prev_seq_) + " is missing");
    }
    report_.version = latest->second.version;
    latest_seq_new_ =
        std::max(chains_.codec_state->next_seq, ctx_.backend->SeqFloor(chains_.model));
    prev_seq_new_ = latest_seq_new_ + 1;
    const ManifestRecord& old_latest = latest->second;
    const ManifestRecord& old_prev = prev->second;
    ManifestRecord new_latest = old_latest;
    std::map<uint32_t, Reversal> reversals;  // by tensor index in the previous manifest
    std::vector<bool> keyframed(old_latest.tensors.size(), false);
    // The records written here live as long as the version before (its reverse deltas, its
    // copies); the latest's keyframes die at the next pass, with the next push's forward
    // deltas. Each group goes to blob files of its own (SealChunkWrites), so that the files of
    // the dead ones are dropped whole and nothing live is ever copied out of them.
    Status encoded = EncodeTensors(old_latest, old_prev, &new_latest, &reversals, &keyframed);
    std::optional<ManifestRecord> new_prev;
    if (encoded.ok() && report_.tensors_keyframed > 0) {
      if (!reversals.empty()) {
        auto reversed = ReversedPrevious(old_prev, new_latest, reversals);
        if (reversed.ok()) {
          new_prev = std::move(reversed).value();
        } else {
          encoded = reversed.status();
        }
      } else {
        ctx_.backend->DiscardChunks(chains_.model, ChunkSet::Of(prev_seq_new_, old_prev));
      }
    }
    if (encoded.ok() && report_.tensors_keyframed > 0) {
      encoded = ctx_.backend->SealChunkWrites(chains_.model);
      if (encoded.ok()) encoded = WriteLatest(old_latest, keyframed, &new_latest);
    }
    if (!encoded.ok() || report_.tensors_keyframed == 0) {
      if (wrote_) {
        ctx_.backend->DiscardChunks(chains_.model, ChunkSet::Of(latest_seq_new_, old_latest));
        ctx_.backend->DiscardChunks(chains_.model, ChunkSet::Of(prev_seq_new_, old_prev));
        replaced_->discarded_begin = latest_seq_new_;
        replaced_->discarded_end = prev_seq_new_ + 1;
      }
      CKPT_RETURN_IF_ERROR(encoded);
      return report_;
    }
    Finish(&new_latest, latest_seq_new_);
    if (new_prev) Finish(&*new_prev, prev_seq_new_);
    report_.bytes_before = old_latest.stored_bytes + (new_prev ? old_prev.stored_bytes : 0);
    report_.bytes_after = new_latest.stored_bytes + (new_prev ? new_prev->stored_bytes : 0);
    const bool prev_replaced = new_prev.has_value();
    CKPT_RETURN_IF_ERROR(Switch(std::move(new_latest), std::move(new_prev), reversals));
    replaced_->begin = prev_replaced ? std::min(prev_seq_, latest_seq_) : latest_seq_;
    replaced_->end = (prev_replaced ? std::max(prev_seq_, latest_seq_) : latest_seq_) + 1;
    return report_;
  }

 private:
  // Decides, tensor by tensor, which of the latest version's tensors become keyframes
  // (`keyframed`, their sizes recorded in `new_latest`) and writes the previous version's
  // reverse deltas against them under prev_seq_new_; the keyframes are encoded to be measured
  // and written by WriteLatest.
  Status EncodeTensors(const ManifestRecord& old_latest, const ManifestRecord& old_prev,
                       ManifestRecord* new_latest, std::map<uint32_t, Reversal>* reversals,
                       std::vector<bool>* keyframed) {
    bool prev_live = false;
    for (const auto& [version, record] : chains_.versions) prev_live |= record.seq == prev_seq_;
    std::map<uint32_t, int> uses;  // how many of the latest's tensors delta against each
    for (const ManifestTensor& e : old_latest.tensors) {
      if (e.kind == FrameKind::kDelta && e.base_seq == prev_seq_) ++uses[e.base_tensor];
    }
    // The candidates: forward deltas against the version before that re-encode cheaply. When
    // there is none (a lossy model with element history), nothing is written at all.
    std::vector<bool> candidate(old_latest.tensors.size(), false);
    for (uint32_t t = 0; t < old_latest.tensors.size(); ++t) {
      const ManifestTensor& le = old_latest.tensors[t];
      if (le.kind != FrameKind::kDelta || le.base_seq != prev_seq_ || le.byte_size == 0) continue;
      if (le.base_tensor >= old_prev.tensors.size()) {
        return Status::DataLoss("model '" + chains_.model + "' manifest " +
                                std::to_string(latest_seq_) +
                                ": delta base tensor index out of range");
      }
      CKPT_ASSIGN_OR_RETURN(const bool cheap, ReencodesCheaply(le, t));
      candidate[t] = cheap;
      if (!cheap) ++report_.tensors_left;
    }
    if (std::find(candidate.begin(), candidate.end(), true) == candidate.end()) {
      return Status::Ok();
    }
    // What the push wrote (forward deltas this pass replaces) stays apart from what it writes.
    CKPT_RETURN_IF_ERROR(ctx_.backend->SealChunkWrites(chains_.model));
    wrote_ = true;
    ChainReader reader(ctx_.db, ctx_.manifests, ctx_.backend, nullptr, chains_.model, ctx_.cache);
    std::vector<uint8_t> latest_chunk, prev_chunk;
    for (uint32_t t = 0; t < old_latest.tensors.size(); ++t) {
      const ManifestTensor& le = old_latest.tensors[t];
      ManifestTensor& ne = new_latest->tensors[t];
      if (!candidate[t]) continue;
      const uint32_t tp = le.base_tensor;
      const ManifestTensor& pe = old_prev.tensors[tp];
      // The version before becomes a delta against this keyframe only if it is a version (a
      // deleted one is left to garbage collection) and no version behind it ends up further
      // than max_decodes payloads from a keyframe. Otherwise the keyframe alone replaces the
      // forward delta: where a chain reaches its bound, the newest version starts the next.
      const bool reverse =
          prev_live && uses[tp] == 1 && DeepestBehind(Link{prev_seq_, tp}, pe) + 1 <= max_decodes_;
      // What the re-encodings may cost: what they replace, plus a keyframe of the chain's size
      // unless the previous version's keyframe is the one that moves here (where pushes outran
      // the rearrangement, or a chain reached its bound, the store gains a keyframe).
      const bool keyframe_moves = reverse && pe.kind == FrameKind::kKeyframe;
      const double budget = kSlack * double(le.stored_bytes + (reverse ? pe.stored_bytes : 0) +
                                            (keyframe_moves ? 0 : le.keyframe_bytes));
      uint64_t keyframe_bytes = 0, covered = 0;
      double keyframe_entropy = 0;
      uint64_t keyframe_exact = 0;
      Reversal reversal{t, 0, 0, 0};
      bool accepted = true;
      for (uint32_t c = 0; c < le.chunk_count && accepted; ++c) {
        if (yield_ && yield_()) {
          return Status::Aborted("model '" + chains_.model +
                                 "': rearrangement stepped aside (a push asked for the model, "
                                 "or the store is stopping)");
        }
        CKPT_RETURN_IF_ERROR(reader.DecodeChunk(latest_seq_, t, c, &latest_chunk));
        CKPT_ASSIGN_OR_RETURN(EncodedChunk keyframe,
                              ReencodeExactly(ctx_, chains_.model, latest_seq_, t, c, le,
                                              latest_chunk, std::nullopt));
        std::string value = ChunkRecord::EncodeChunk(keyframe, FrameKind::kKeyframe, latest_chunk);
        keyframe_bytes += value.size();
        if (kept_bytes_ + value.size() <= kKeptKeyframeBytes) {
          kept_bytes_ += value.size();
          kept_keyframes_[ChunkIndex{t, c}] = std::move(value);
        }
        keyframe_entropy += keyframe.info.model_entropy_bits;
        keyframe_exact += keyframe.info.exact_elements;
        if (reverse) {
          CKPT_RETURN_IF_ERROR(reader.DecodeChunk(prev_seq_, tp, c, &prev_chunk));
          CKPT_ASSIGN_OR_RETURN(
              EncodedChunk delta,
              ReencodeExactly(ctx_, chains_.model, prev_seq_, tp, c, pe, prev_chunk,
                              std::span<const uint8_t>(latest_chunk)));
          const std::string delta_value =
              ChunkRecord::EncodeChunk(delta, FrameKind::kDelta, prev_chunk);
          CKPT_RETURN_IF_ERROR(
              ctx_.backend->PutChunk(chains_.model, prev_seq_new_, tp, c, delta_value)
                  .WithContext("writing rearranged chunk"));
          reversal.stored_bytes += delta_value.size();
          reversal.entropy_bits += delta.info.model_entropy_bits;
          reversal.exact_elements += delta.info.exact_elements;
        }
        covered += ChainReader::ChunkLength(le, c);
        const double spent = double(keyframe_bytes + reversal.stored_bytes);
        accepted = spent <= kEarlySlack * budget * double(covered) / double(le.byte_size);
      }
      if (accepted) accepted = double(keyframe_bytes + reversal.stored_bytes) <= budget;
      if (!accepted) {
        // Its reverse deltas written so far are overwritten by copies of the stored chunks
        // (ReversedPrevious).
        for (auto it = kept_keyframes_.lower_bound(ChunkIndex{t, 0});
             it != kept_keyframes_.end() && it->first.first == t;) {
          kept_bytes_ -= it->second.size();
          it = kept_keyframes_.erase(it);
        }
        ++report_.tensors_left;
        continue;
      }
      (*keyframed)[t] = true;
      ne.MakeKeyframe(latest_seq_new_, keyframe_bytes);
      ne.stored_bytes = keyframe_bytes;
      ne.entropy_bits = keyframe_entropy;
      ne.exact_elements = keyframe_exact;
      ++report_.tensors_keyframed;
      if (reverse) {
        reversals->emplace(tp, reversal);
        ++report_.tensors_reversed;
      }
    }
    return Status::Ok();
  }

  // Whether tensor `t` of the latest manifest, described by `e`, can be re-encoded backwards
  // at about the cost of its forward delta: lossless, or lossy on a plain lattice (as its first
  // chunk shows; the byte budget catches the rest).
  Result<bool> ReencodesCheaply(const ManifestTensor& e, uint32_t t) {
    if (e.codec_id != static_cast<uint16_t>(CodecId::kLossyQuantized)) return true;
    rocksdb::PinnableSlice value;
    CKPT_RETURN_IF_ERROR(
        ctx_.backend->GetChunk(rocksdb::ReadOptions(), chains_.model, latest_seq_, t, 0, &value)
            .WithContext("model '" + chains_.model + "': reading chunk to rearrange"));
    CKPT_ASSIGN_OR_RETURN(const ChunkRecord record, ChunkRecord::DecodeFrom(value.ToStringView()));
    if (record.codec_id != static_cast<uint16_t>(CodecId::kLossyQuantized)) return true;
    return LossyPayloadIsPlainLattice(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(record.payload.data()), record.payload.size()));
  }

  // Writes the latest version under latest_seq_new_: the tensors EncodeTensors keyframed as
  // the keyframes it measured (the encoding is deterministic: a different size is an internal
  // error), the others as copies of their stored chunks.
  Status WriteLatest(const ManifestRecord& old_latest, const std::vector<bool>& keyframed,
                     ManifestRecord* new_latest) {
    ChainReader reader(ctx_.db, ctx_.manifests, ctx_.backend, nullptr, chains_.model, ctx_.cache);
    std::vector<uint8_t> latest_chunk;
    for (uint32_t t = 0; t < old_latest.tensors.size(); ++t) {
      const ManifestTensor& le = old_latest.tensors[t];
      ManifestTensor& ne = new_latest->tensors[t];
      if (!keyframed[t]) {
        CKPT_RETURN_IF_ERROR(CopyTensor(latest_seq_, latest_seq_new_, t, &ne));
        continue;
      }
      uint64_t written = 0;
      for (uint32_t c = 0; c < le.chunk_count; ++c) {
        if (yield_ && yield_()) {
          return Status::Aborted("model '" + chains_.model +
                                 "': rearrangement stepped aside (a push asked for the model, "
                                 "or the store is stopping)");
        }
        std::string value;
        if (auto kept = kept_keyframes_.find(ChunkIndex{t, c}); kept != kept_keyframes_.end()) {
          value = std::move(kept->second);
        } else {
          CKPT_RETURN_IF_ERROR(reader.DecodeChunk(latest_seq_, t, c, &latest_chunk));
          CKPT_ASSIGN_OR_RETURN(EncodedChunk keyframe,
                                ReencodeExactly(ctx_, chains_.model, latest_seq_, t, c, le,
                                                latest_chunk, std::nullopt));
          value = ChunkRecord::EncodeChunk(keyframe, FrameKind::kKeyframe, latest_chunk);
        }
        CKPT_RETURN_IF_ERROR(ctx_.backend->PutChunk(chains_.model, latest_seq_new_, t, c, value)
                                 .WithContext("writing rearranged chunk"));
        written += value.size();
      }
      if (written != ne.stored_bytes) {
        return Status::Internal("model '" + chains_.model + "': tensor '" + le.name +
                                "' re-encoded to " + std::to_string(written) + " bytes, measured " +
                                std::to_string(ne.stored_bytes));
      }
    }
    return Status::Ok();
  }

  // The previous manifest with the reversed tensors as deltas against the new latest; its
  // other tensors' chunks are copied under the new seq.
  Result<ManifestRecord> ReversedPrevious(const ManifestRecord& old_prev,
                                          const ManifestRecord& new_latest,
                                          const std::map<uint32_t, Reversal>& reversals) {
    ManifestRecord new_prev = old_prev;
    for (uint32_t tp = 0; tp < new_prev.tensors.size(); ++tp) {
      ManifestTensor& e = new_prev.tensors[tp];
      auto r = reversals.find(tp);
      if (r == reversals.end()) {
        CKPT_RETURN_IF_ERROR(CopyTensor(prev_seq_, prev_seq_new_, tp, &e));
        continue;
      }
      const Reversal& reversal = r->second;
      e.LinkTo(latest_seq_new_, reversal.latest_tensor, new_latest.tensors[reversal.latest_tensor]);
      e.chain_bytes += reversal.stored_bytes;
      e.stored_bytes = reversal.stored_bytes;
      e.entropy_bits = reversal.entropy_bits;
      e.exact_elements = reversal.exact_elements;
    }
    return new_prev;
  }

  // Copies tensor `tensor` of manifest `from` under `to`, where `e` describes it.
  Status CopyTensor(uint64_t from, uint64_t to, uint32_t tensor, ManifestTensor* e) {
    CKPT_RETURN_IF_ERROR(CopyTensorChunks(ctx_, chains_.model, from, to, tensor, e->chunk_count));
    if (e->keyframe_seq == from) e->keyframe_seq = to;
    return Status::Ok();
  }

  // The most payload decodes past its keyframe any version behind `root` (a tensor that is to
  // become one delta past the latest's keyframe) would need then: `root` itself needs 1, and a
  // tensor whose chain runs through it its links to `root` more. Chain lengths recorded in
  // manifests are never below the true ones, so this never underestimates.
  uint32_t DeepestBehind(const Link& root, const ManifestTensor& root_entry) {
    uint32_t deepest = 1;
    for (const Link& d : Behind(root)) {
      const ManifestTensor& e = chains_.manifests.at(d.first).tensors[d.second];
      const int64_t depth = int64_t{e.chain_length} - int64_t{root_entry.chain_length} + 1;
      deepest = std::max<uint32_t>(deepest, static_cast<uint32_t>(std::max<int64_t>(depth, 1)));
    }
    return deepest;
  }

  // Every tensor whose delta chain runs through `root` (the latest manifest's left out).
  std::vector<Link> Behind(const Link& root) {
    BuildDependents();
    std::vector<Link> behind;
    std::set<Link> seen;
    std::vector<Link> stack{root};
    while (!stack.empty()) {
      const Link link = stack.back();
      stack.pop_back();
      auto it = dependents_.find(link);
      if (it == dependents_.end()) continue;
      for (const Link& d : it->second) {
        if (!seen.insert(d).second) continue;
        behind.push_back(d);
        stack.push_back(d);
      }
    }
    return behind;
  }

  // Every delta's base link -> the deltas against it, the latest manifest's left out (its
  // deltas are what this pass replaces).
  void BuildDependents() {
    if (dependents_built_) return;
    dependents_built_ = true;
    for (const auto& [seq, m] : chains_.manifests) {
      if (seq == latest_seq_) continue;
      for (uint32_t t = 0; t < m.tensors.size(); ++t) {
        const ManifestTensor& e = m.tensors[t];
        if (e.kind == FrameKind::kDelta)
          dependents_[{e.base_seq, e.base_tensor}].push_back({seq, t});
      }
    }
  }

  // Totals and floor of a manifest written under `seq`.
  static void Finish(ManifestRecord* m, uint64_t seq) {
    m->stored_bytes = 0;
    m->floor_seq = seq;
    for (const ManifestTensor& e : m->tensors) {
      m->stored_bytes += e.stored_bytes;
      m->floor_seq = std::min(m->floor_seq, e.keyframe_seq);
    }
  }

  // The switch: the new manifests, every reference to the replaced ones, the chain lengths
  // behind the reversed tensors, the versions, the codec state and the model record, in one
  // synced batch.
  Status Switch(ManifestRecord new_latest, std::optional<ManifestRecord> new_prev,
                const std::map<uint32_t, Reversal>& reversals) {
    ModelChange change;
    change.refers_to_new_chunks = true;
    rocksdb::WriteBatch& batch = change.batch;
    std::set<uint64_t> changed;
    // A tensor behind a reversed one is now as many links from the latest's keyframe as it was
    // from the reversed tensor, plus one.
    const ManifestRecord& old_prev = chains_.manifests.at(prev_seq_);
    for (const auto& [tp, reversal] : reversals) {
      const uint32_t prev_chain_length = old_prev.tensors[tp].chain_length;
      const uint64_t keyframe_bytes = new_latest.tensors[reversal.latest_tensor].keyframe_bytes;
      for (const Link& d : Behind(Link{prev_seq_, tp})) {
        ManifestTensor& e = chains_.manifests.at(d.first).tensors[d.second];
        const int64_t depth = int64_t{e.chain_length} - int64_t{prev_chain_length} + 1;
        e.chain_length = static_cast<uint32_t>(std::max<int64_t>(depth, 1));
        e.keyframe_seq = latest_seq_new_;
        e.keyframe_bytes = keyframe_bytes;
        changed.insert(d.first);
      }
    }
    const bool prev_replaced = new_prev.has_value();
    chains_.manifests.emplace(latest_seq_new_, std::move(new_latest));
    if (prev_replaced) chains_.manifests.emplace(prev_seq_new_, std::move(*new_prev));
    auto renamed = [&](uint64_t seq) {
      if (seq == latest_seq_) return latest_seq_new_;
      if (prev_replaced && seq == prev_seq_) return prev_seq_new_;
      return seq;
    };
    for (auto& [seq, m] : chains_.manifests) {
      if (seq == latest_seq_ || (prev_replaced && seq == prev_seq_)) continue;
      const bool is_new = seq == latest_seq_new_ || (prev_replaced && seq == prev_seq_new_);
      bool dirty = is_new || changed.count(seq);
      for (ManifestTensor& e : m.tensors) {
        if (e.kind == FrameKind::kDelta && renamed(e.base_seq) != e.base_seq) {
          e.base_seq = renamed(e.base_seq);
          dirty = true;
        }
        if (renamed(e.keyframe_seq) != e.keyframe_seq) {
          e.keyframe_seq = renamed(e.keyframe_seq);
          dirty = true;
        }
      }
      if (!dirty) continue;
      if (!is_new) {
        m.floor_seq = seq;
        for (const ManifestTensor& e : m.tensors)
          m.floor_seq = std::min(m.floor_seq, e.keyframe_seq);
      }
      batch.Put(ctx_.manifests, keys::ManifestKey(chains_.model, seq), Encoded(m));
    }
    for (auto& [version, record] : chains_.versions) {
      const uint64_t seq = renamed(record.seq);
      if (seq == record.seq && !changed.count(seq)) continue;
      const ManifestRecord& written = chains_.manifests.at(seq);
      record.seq = seq;
      record.floor_seq = written.floor_seq;
      record.stored_bytes = written.stored_bytes;
      record.kind = VersionRecord::KindOf(written);
      batch.Put(ctx_.versions, keys::VersionKey(chains_.model, version), Encoded(record));
    }
    CodecStateRecord state = *chains_.codec_state;
    state.reference_seq = latest_seq_new_;
    state.reference_floor_seq = chains_.manifests.at(latest_seq_new_).floor_seq;
    state.next_seq = (prev_replaced ? prev_seq_new_ : latest_seq_new_) + 1;
    chains_.codec_state = state;
    batch.Put(ctx_.codec_state, chains_.model, Encoded(state));
    // The replaced manifests go in the same batch: a scrub beside the pass never finds them
    // orphaned, and a crash cannot leave them behind.
    CKPT_ASSIGN_OR_RETURN(const ModelChains::Removal removal,
                          chains_.RemoveNoLongerNeeded(ctx_, &change));
    replaced_->bytes_removed = removal.bytes;
    uint64_t stored = 0;
    for (const auto& [seq, m] : chains_.manifests) stored += m.stored_bytes;
    chains_.record.stored_bytes = stored;
    batch.Put(ctx_.models, chains_.model, Encoded(chains_.record));
    CKPT_RETURN_IF_ERROR(
        ctx_.backend->Commit(chains_.model, change, "committing rearranged versions"));
    ctx_.counters->rearrangements.fetch_add(1, std::memory_order_relaxed);
    ctx_.cache->Rekey(chains_.model, latest_seq_, latest_seq_new_);
    if (prev_replaced) ctx_.cache->Rekey(chains_.model, prev_seq_, prev_seq_new_);
    return Status::Ok();
  }

  const StoreContext& ctx_;
  ModelChains& chains_;
  const uint32_t max_decodes_;
  const std::function<bool()>& yield_;
  ReplacedSeqs* const replaced_;
  RearrangeReport report_;
  // Measured keyframes kept for WriteLatest, by (tensor, chunk) of the latest manifest.
  std::map<ChunkIndex, std::string> kept_keyframes_;
  uint64_t kept_bytes_ = 0;
  uint64_t latest_seq_ = 0, prev_seq_ = 0;
  uint64_t latest_seq_new_ = 0, prev_seq_new_ = 0;
  bool wrote_ = false;  // chunks were written under the new seqs
  bool dependents_built_ = false;
  std::map<Link, std::vector<Link>> dependents_;
};

}  // namespace

Result<RearrangeReport> RearrangeLatest(const StoreContext& ctx, ModelChains& chains,
                                        uint32_t max_decodes, const std::function<bool()>& yield,
                                        ReplacedSeqs* replaced) {
  return Rearranger(ctx, chains, max_decodes, yield, replaced).Run();
}

}  // namespace ckpt
