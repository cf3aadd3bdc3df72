// The encoded restore (encoded_restore.h).
#include "read/encoded_restore.h"

#include <rocksdb/slice.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/encoded_pull.h"
#include "read/chain_reader.h"
#include "read/exact_reencode.h"
#include "read/view_plan.h"

namespace ckpt {
namespace {

// An exact keyframe is coded in place of a chain only where the chain's deltas weigh at least
// this fraction (1/N) of it.
constexpr uint64_t kKeyframeWorthDeltaShare = 16;

// One link frame of the body: which stored record (or a record coded for this pull), and what
// the client decodes it against.
struct Link {
  uint32_t body_tensor;  // index in the restored header
  uint32_t chunk;
  LinkBase base;
  StoreBackend::ChunkAddress address;
  uint64_t record_bytes = 0;
  SinceDeltaCache::Record coded;  // when set: sent instead of a stored record
  // A part frame sent before the link (the first of a box's links); alone when `frame_only`
  // (a box that holds no element).
  std::string part_frame;
  bool frame_only = false;
};

// The tensor of `since` a chunk of `target` can be coded against: the same name, dtype and
// chunking, and for tiles the same shape (the client's copy of it is then that tensor's
// reconstruction, chunk for chunk).
std::optional<uint32_t> SameLayout(const ManifestRecord& since, const ManifestTensor& target) {
  for (uint32_t i = 0; i < since.tensors.size(); ++i) {
    const ManifestTensor& t = since.tensors[i];
    if (t.name != target.name) continue;
    if (t.dtype == target.dtype && t.byte_size == target.byte_size &&
        t.chunk_bytes == target.chunk_bytes && t.chunk_count == target.chunk_count &&
        t.tile_counts == target.tile_counts && (t.tile_counts.empty() || t.shape == target.shape)) {
      return i;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

class EncodedRestoreStream final : public RestoreStream {
 public:
  EncodedRestoreStream(const StoreContext& ctx, ScopedSnapshot snapshot, std::string model,
                       VersionInfo info, uint64_t cache_generation)
      : ctx_(ctx),
        snapshot_(std::move(snapshot)),
        model_(std::move(model)),
        info_(std::move(info)),
        cache_generation_(cache_generation) {
    read_options_ = snapshot_.reads();
    read_options_.verify_checksums = false;  // each record carries its own checksums
  }

  // Lays out the body: every link of every chunk, in body order, with its record's size; only
  // the chunks that hold the part `selection` names unless it is whole.
  Status Plan(const VersionRecord& record, uint64_t since_seq, uint64_t since_version,
              const RestoreSelection& selection) {
    ChainReader reader(ctx_.db, ctx_.manifests, ctx_.backend, snapshot_.get(), model_, ctx_.cache,
                       cache_generation_);
    CKPT_ASSIGN_OR_RETURN(const ManifestRecord* manifest, reader.Manifest(record.seq));
    ViewPlan view;
    if (selection.whole()) {
      for (uint32_t mi = 0; mi < manifest->tensors.size(); ++mi) {
        if (!record.Dropped(mi)) view.tensors.push_back({mi, {}, true});
      }
    } else {
      CKPT_ASSIGN_OR_RETURN(view, PlanView(*manifest, record, info_.version, selection));
    }
    const ManifestRecord* since = nullptr;
    if (since_seq != 0) {
      CKPT_ASSIGN_OR_RETURN(since, reader.Manifest(since_seq));
    }
    // What this pull may code beyond the records it finds coded.
    uint64_t coding_budget = ctx_.since_deltas != nullptr ? ctx_.since_deltas->budget_bytes() : 0;
    for (uint32_t body_tensor = 0; body_tensor < view.tensors.size(); ++body_tensor) {
      const ViewTensor& part = view.tensors[body_tensor];
      const uint32_t mi = part.tensor;
      const ManifestTensor& target = manifest->tensors[mi];
      // The chunks sent: all, or those holding the box.
      uint32_t first_chunk = 0, last_chunk = target.chunk_count;  // one past
      std::vector<std::pair<uint32_t, uint32_t>> chunk_ranges;
      std::string part_frame;
      const size_t first_link = links_.size();
      if (!target.tile_counts.empty()) {
        // A tiled tensor, whole or a box of it: its chunks are no runs of the body.
        CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, target.Grid());
        const TensorBox box = part.whole ? WholeBox(target.shape) : part.box;
        chunk_ranges = grid.ChunkRanges(box);
        part_frame = EncodeTilesFrame(body_tensor, target.chunk_bytes, target.shape, box.offsets,
                                      target.tile_counts);
        tiles_ = true;
        if (chunk_ranges.empty()) {
          links_.push_back({body_tensor, 0, LinkBase::kNone, {}, 0, nullptr, part_frame, true});
          continue;
        }
      } else if (!part.whole) {
        const auto chunks =
            ChunksHoldingBox(target.shape, part.box, DTypeSize(target.dtype), target.chunk_bytes);
        first_chunk = chunks ? chunks->first : 0;
        last_chunk = chunks ? chunks->second + 1 : 0;
        part_frame = EncodePartFrame(body_tensor, target.byte_size, target.chunk_bytes,
                                     target.shape, part.box.offsets);
        if (!chunks) {
          links_.push_back({body_tensor, 0, LinkBase::kNone, {}, 0, nullptr, part_frame, true});
          continue;
        }
      }
      if (chunk_ranges.empty()) chunk_ranges.emplace_back(first_chunk, last_chunk);
      // The tensor's chain, newest first, down to its keyframe or to the client's version.
      std::vector<std::pair<uint64_t, uint32_t>> chain;
      bool from_since = false;
      uint64_t s = record.seq;
      uint32_t t = mi;
      for (;;) {
        CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, reader.Manifest(s));
        if (t >= m->tensors.size()) {
          return Status::DataLoss("model '" + model_ + "' version " + std::to_string(m->version) +
                                  ": delta base tensor index out of range");
        }
        const ManifestTensor& e = m->tensors[t];
        chain.emplace_back(s, t);
        if (e.kind == FrameKind::kKeyframe) break;
        if (e.base_seq == since_seq && since_seq != 0) {
          from_since = true;
          break;
        }
        if (chain.size() > ChainReader::kMaxChainLinks) {
          return Status::DataLoss("model '" + model_ + "' tensor '" + e.name +
                                  "': delta chain too long (cyclic?)");
        }
        s = e.base_seq;
        t = e.base_tensor;
      }
      // A chain that does not run through the client's version (it was rearranged, or
      // restarted at a keyframe) may be replaced by a delta from what the client holds, coded
      // here; a chain of several links by an exact keyframe (what a client holding nothing
      // would otherwise receive several times over), where either is smaller. So may a chain
      // of several links that does run through it but weighs more than half the chunk (the
      // client holds a version far from this one).
      std::optional<uint32_t> since_tensor;
      bool keyframe_instead = false;
      if ((!from_since || chain.size() > 1) && ctx_.since_deltas != nullptr &&
          target.byte_size > 0) {
        if (since != nullptr) since_tensor = SameLayout(*since, target);
        keyframe_instead = !since_tensor && chain.size() > 1;
      }
      for (const auto& [range_begin, range_end] : chunk_ranges)
        for (uint32_t c = range_begin; c < range_end; ++c) {
          const size_t first = links_.size();
          uint64_t chain_bytes = 0;
          for (size_t k = chain.size(); k-- > 0;) {
            const bool oldest = k + 1 == chain.size();
            const LinkBase base =
                !oldest ? LinkBase::kPrevious : (from_since ? LinkBase::kSince : LinkBase::kNone);
            Link link{body_tensor, c,       base, {chain[k].first, chain[k].second, c},
                      0,           nullptr, {},   false};
            CKPT_ASSIGN_OR_RETURN(link.record_bytes, RecordBytes(link.address));
            chain_bytes += kLinkFrameOverhead + link.record_bytes;
            links_.push_back(std::move(link));
          }
          if (!since_tensor && !keyframe_instead) continue;
          if (from_since && chain_bytes <= ChainReader::ChunkLength(target, c) / 2) continue;
          // An exact keyframe is about as large as the chain's own keyframe record, so in place of
          // a chain whose deltas weigh little it would save little more than they weigh, for a
          // decode and an encode of the whole chunk here.
          const uint64_t deltas_bytes =
              chain_bytes - kLinkFrameOverhead - links_[first].record_bytes;
          const bool keyframe_worth_coding =
              from_since || deltas_bytes * kKeyframeWorthDeltaShare >= chain_bytes;
          if (!since_tensor && !keyframe_worth_coding) continue;
          // A record that cannot be coded (a chunk of the client's version unreadable) leaves the
          // chain to be sent: the pull is only larger. Nor is one sent that is no smaller.
          const uint64_t useful_below = chain_bytes - std::min(chain_bytes, kLinkFrameOverhead);
          const auto smaller = [&](const Result<SinceDeltaCache::Record>& r) {
            return r.ok() && *r != nullptr && (*r)->size() < useful_below;
          };
          LinkBase coded_base = since_tensor ? LinkBase::kSince : LinkBase::kNone;
          Result<SinceDeltaCache::Record> coded =
              since_tensor ? CodedLink(reader, record.seq, mi, target, since_seq, *since_tensor, c,
                                       useful_below, &coding_budget)
                           : CodedLink(reader, record.seq, mi, target, 0, 0, c, useful_below,
                                       &coding_budget);
          // The client's version may be far from this one (an older version pulled while a newer
          // one is held): where its delta is no smaller than the chain, or than the chain's own
          // keyframe record, an exact keyframe (what a client holding nothing receives) may be.
          const uint64_t chain_keyframe_bytes =
              from_since ? chain_bytes : links_[first].record_bytes;  // the oldest link
          if (since_tensor && chain.size() > 1 && keyframe_worth_coding &&
              (!smaller(coded) || (*coded)->size() > chain_keyframe_bytes)) {
            Result<SinceDeltaCache::Record> keyframe =
                CodedLink(reader, record.seq, mi, target, 0, 0, c, useful_below, &coding_budget);
            if (smaller(keyframe) && (!smaller(coded) || (*keyframe)->size() < (*coded)->size())) {
              coded = std::move(keyframe);
              coded_base = LinkBase::kNone;
            }
          }
          if (!smaller(coded)) continue;
          links_.resize(first);
          links_.push_back({body_tensor,
                            c,
                            coded_base,
                            {},
                            (*coded)->size(),
                            std::move(coded).value(),
                            {},
                            false});
        }
      if (!part_frame.empty()) links_[first_link].part_frame = std::move(part_frame);
    }
    preamble_ = selection.whole()
                    ? EncodePullPreamble(info_.version, since_seq != 0 ? since_version : 0,
                                         record.raw_header, record.restored_sha256_hex, tiles_)
                    : EncodePartPullPreamble(info_.version, view.raw_header, tiles_);
    size_ = preamble_.size() + EncodePullEnd().size();
    for (const Link& link : links_) {
      size_ += link.part_frame.size();
      if (!link.frame_only) size_ += kLinkFrameOverhead + link.record_bytes;
    }
    return Status::Ok();
  }

  const VersionInfo& info() const override { return info_; }
  uint64_t size() const override { return size_; }

  Result<std::span<const uint8_t>> Next() override {
    piece_.clear();
    if (!preamble_sent_) {
      preamble_sent_ = true;
      piece_ = preamble_;
    } else if (next_link_ < links_.size()) {
      const Link& link = links_[next_link_++];
      piece_ = link.part_frame;
      if (link.frame_only) {
        return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(piece_.data()),
                                        piece_.size());
      }
      if (link.coded != nullptr) {
        piece_ += EncodeLinkFrameHead(link.body_tensor, link.chunk, link.base, link.coded->size());
        piece_.append(*link.coded);
        return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(piece_.data()),
                                        piece_.size());
      }
      rocksdb::PinnableSlice value;
      CKPT_RETURN_IF_ERROR(Read(link.address, &value));
      if (value.size() != link.record_bytes) {
        return Status::DataLoss("model '" + model_ + "' version " + std::to_string(info_.version) +
                                ": a chunk record changed size while it was sent");
      }
      piece_ += EncodeLinkFrameHead(link.body_tensor, link.chunk, link.base, value.size());
      piece_.append(value.data(), value.size());
    } else if (!end_sent_) {
      end_sent_ = true;
      piece_ = EncodePullEnd();
    }
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(piece_.data()), piece_.size());
  }

 private:
  Status Read(const StoreBackend::ChunkAddress& a, rocksdb::PinnableSlice* value) {
    return ctx_.backend->GetChunk(read_options_, model_, a.seq, a.tensor, a.chunk, value);
  }

  Result<uint64_t> RecordBytes(const StoreBackend::ChunkAddress& a) {
    rocksdb::PinnableSlice value;
    CKPT_RETURN_IF_ERROR(Read(a, &value));
    return uint64_t{value.size()};
  }

  // The record that turns chunk `chunk` of tensor `since_tensor` of manifest `since_seq` (the
  // client's; 0: none, a keyframe) into the same chunk of tensor `tensor` of `target_seq`: from
  // the cache, else coded exactly (on the stored payload's lattice where it has one) while
  // `budget` lasts; nullptr when the budget is spent, or when the cache knows the record only by
  // its size and that is not below `useful_below`. A record coded here of `useful_below` bytes or
  // more (which the pull does not send) is kept by its size only.
  Result<SinceDeltaCache::Record> CodedLink(ChainReader& reader, uint64_t target_seq,
                                            uint32_t tensor, const ManifestTensor& entry,
                                            uint64_t since_seq, uint32_t since_tensor,
                                            uint32_t chunk, uint64_t useful_below,
                                            uint64_t* budget) {
    const SinceDeltaCache::Key key{cache_generation_, model_, target_seq, since_seq, tensor, chunk};
    // A model dropped whole since this pull's snapshot may reuse its seqs: neither read nor
    // keep records then.
    const bool cacheable = ctx_.cache->generation() == cache_generation_;
    if (cacheable) {
      SinceDeltaCache::Known known = ctx_.since_deltas->Get(key);
      if (known.record != nullptr) return known.record;
      if (known.record_bytes >= useful_below) return SinceDeltaCache::Record();
    }
    if (*budget == 0) return SinceDeltaCache::Record();
    std::vector<uint8_t> target, base;
    CKPT_RETURN_IF_ERROR(reader.DecodeChunk(target_seq, tensor, chunk, &target));
    std::optional<std::span<const uint8_t>> reference;
    if (since_seq != 0) {
      CKPT_RETURN_IF_ERROR(reader.DecodeChunk(since_seq, since_tensor, chunk, &base));
      reference = base;
    }
    CKPT_ASSIGN_OR_RETURN(
        const EncodedChunk encoded,
        ReencodeExactly(ctx_, model_, target_seq, tensor, chunk, entry, target, reference));
    auto record = std::make_shared<const std::string>(ChunkRecord::EncodeChunk(
        encoded, since_seq != 0 ? FrameKind::kDelta : FrameKind::kKeyframe, target));
    *budget -= std::min<uint64_t>(*budget, record->size());
    ctx_.counters->pull_chunks_coded.fetch_add(1, std::memory_order_relaxed);
    if (cacheable) {
      if (record->size() < useful_below) {
        ctx_.since_deltas->Put(key, record);
      } else {
        ctx_.since_deltas->PutSizeOnly(key, record->size());
      }
    }
    return SinceDeltaCache::Record(std::move(record));
  }

  const StoreContext& ctx_;
  ScopedSnapshot snapshot_;
  const std::string model_;
  const VersionInfo info_;
  const uint64_t cache_generation_;
  rocksdb::ReadOptions read_options_;
  std::vector<Link> links_;
  bool tiles_ = false;  // a tensor sent is tiled: the body has tiles frames
  std::string preamble_;
  uint64_t size_ = 0;
  std::string piece_;
  size_t next_link_ = 0;
  bool preamble_sent_ = false;
  bool end_sent_ = false;
};

}  // namespace

Result<std::unique_ptr<RestoreStream>> OpenEncodedRestoreStream(
    const StoreContext& ctx, ScopedSnapshot snapshot, std::string model, VersionInfo info,
    VersionRecord record, uint64_t cache_generation, uint64_t since_seq, uint64_t since_version,
    const RestoreSelection& selection) {
  auto stream = std::make_unique<EncodedRestoreStream>(ctx, std::move(snapshot), std::move(model),
                                                       std::move(info), cache_generation);
  CKPT_RETURN_IF_ERROR(stream->Plan(record, since_seq, since_version, selection));
  return std::unique_ptr<RestoreStream>(std::move(stream));
}

}  // namespace ckpt
