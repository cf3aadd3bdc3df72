// The restore stream (restore_stream.h).
#include "read/restore_stream.h"

#include <deque>
#include <future>
#include <optional>
#include <span>
#include <vector>

#include "ckpt/base/chunk_grid.h"
#include "ckpt/base/hashing.h"
#include "context/reference_cache.h"
#include "read/catalog.h"
#include "read/chain_reader.h"

namespace ckpt {
namespace {

class RestoreStreamImpl final : public RestoreStream {
 public:
  RestoreStreamImpl(const StoreContext& ctx, ScopedSnapshot snapshot, std::string model,
                    VersionInfo info, VersionRecord record, uint64_t cache_generation,
                    bool use_cache)
      : ctx_(ctx),
        snapshot_(std::move(snapshot)),
        info_(std::move(info)),
        record_(std::move(record)),
        cache_generation_(cache_generation),
        use_cache_(use_cache),
        remote_(ctx.backend->ReadWindow() > 1),
        reader_(ctx.db, ctx.manifests, ctx.backend, snapshot_.get(), std::move(model),
                use_cache ? ctx.cache : nullptr, cache_generation) {}

  ~RestoreStreamImpl() override {
    queue_.clear();  // waits for prefetches still reading through the snapshot
    ReportLinksDecoded();
  }

  Status Init() {
    if (use_cache_) ctx_.counters->restores.fetch_add(1, std::memory_order_relaxed);
    CKPT_ASSIGN_OR_RETURN(manifest_, reader_.Manifest(record_.seq));
    sha_.Update(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(record_.raw_header.data()), record_.raw_header.size()));
    previous_hashed_ = HashedAlready();
    // Restoring the version the next push deltas against (the usual `latest` after a restart):
    // its decoded chunks are exactly the reference cache's content, so keep them there; the next
    // restore of it and the next push then need no chain replay. Any other version is kept as
    // restored chunks, evicted before references: restoring the versions of a chain in turn (an
    // evaluation sweep) then replays one link per version instead of the whole chain. Only for
    // versions the cache keeps whole (ReferenceCache::KeepsVersionOf).
    CKPT_ASSIGN_OR_RETURN(auto state,
                          ctx_.GetRecord<CodecStateRecord>(snapshot_.reads(), ctx_.codec_state,
                                                           info_.model, "codec state"));
    if (use_cache_ && ctx_.cache->KeepsVersionOf(record_.raw_bytes)) {
      cache_as_ = state && state->reference_seq == record_.seq ? ReferenceCache::Kind::kReference
                                                               : ReferenceCache::Kind::kRestored;
    }
    if (use_cache_) {
      // The version before, as an evaluation sweep restores it first: a reverse chain stores it
      // against this one, so its cached chunks are one link away.
      CKPT_ASSIGN_OR_RETURN(auto older,
                            FindVersionBefore(ctx_, snapshot_.reads(), info_.model, info_.version));
      if (older) reader_.SetNeighbour(older->second.seq);
    }
    Schedule();  // the first chunks decode while the header is being sent
    return Status::Ok();
  }

  const VersionInfo& info() const override { return info_; }
  uint64_t size() const override { return record_.raw_bytes; }

  Result<std::span<const uint8_t>> Next() override {
    if (!header_sent_) {
      header_sent_ = true;
      std::span<const uint8_t> header(reinterpret_cast<const uint8_t*>(record_.raw_header.data()),
                                      record_.raw_header.size());
      sent_ += header.size();
      return MaybeVerified(header);
    }
    Schedule();
    if (queue_.empty()) return std::span<const uint8_t>();
    Slot& slot = queue_.front();
    if (!slot.decoded) {
      slot.decoded = true;
      slot.status = slot.done.valid() ? slot.done.get() : DecodeAndHash(slot, HashedAlready());
    }
    CKPT_RETURN_IF_ERROR(slot.status);
    Piece& piece = slot.pieces[slot.next++];
    piece_ = std::move(piece.data);
    if (cache_as_ && piece.chunk != kBand &&
        !ctx_.cache->Contains(info_.model, record_.seq, piece.tensor, piece.chunk)) {
      // The cache shares the buffer being sent (both only read it).
      ctx_.cache->Put(info_.model, record_.seq, piece.tensor, piece.chunk, piece_, *cache_as_,
                      cache_generation_);
    }
    if (slot.next == slot.pieces.size()) {
      bytes_ahead_ -= slot.bytes;
      queue_.pop_front();
    }
    Schedule();  // the next chunks decode while this one is being sent
    sent_ += piece_->size();
    return MaybeVerified(*piece_);
  }

 private:
  // Piece::chunk of a band of a tiled tensor put back in row-major order.
  static constexpr uint32_t kBand = UINT32_MAX;
  // One chunk of the body, or a band of a tiled tensor.
  struct Piece {
    uint32_t tensor = 0;
    uint32_t chunk = 0;
    ReferenceCache::Chunk data;
  };
  // Consecutive chunks decoded by one job: a worker thread decodes them ahead of the one being
  // sent, then adds them to the body's SHA-256 once the slot before it has (so the hash runs
  // beside the decoding, in body order, off the network thread). Small chunks are gathered so
  // that a job is worth its thread; a slot smaller than that (the end of a body) is decoded
  // inline when its turn comes.
  struct Slot {
    std::vector<Piece> pieces;
    uint64_t bytes = 0;
    size_t next = 0;                  // the next piece to hand out
    std::future<Status> done;         // valid when decoding asynchronously
    std::shared_future<void> hashed;  // ready once its pieces are in the SHA-256
    // The chunks of a band of a tiled tensor (not runs of the body): put together once decoded.
    std::optional<TensorBox> band;
    bool decoded = false;
    Status status;
  };
  // Decoding ahead uses the other cores while the network thread writes; memory is bounded by
  // the slots ahead (each at most max(chunk, kMinSlotBytes)) and kMaxAheadBytes. Where every
  // chunk read is a round trip (RADOS, S3: StoreBackend::ReadWindow), latency rather than the
  // cores bounds a restore: more slots run ahead, one chunk each, so that reads overlap.
  static constexpr size_t kMaxSlotsAhead = 3;
  static constexpr uint64_t kMaxAheadBytes = 16 << 20;
  static constexpr uint64_t kMinSlotBytes = 256 << 10;
  static constexpr size_t kRemoteSlotsAhead = 16;
  static constexpr uint64_t kRemoteAheadBytes = 64 << 20;
  size_t max_slots_ahead() const { return remote_ ? kRemoteSlotsAhead : kMaxSlotsAhead; }
  uint64_t max_ahead_bytes() const { return remote_ ? kRemoteAheadBytes : kMaxAheadBytes; }
  uint64_t min_slot_bytes() const { return remote_ ? 1 : kMinSlotBytes; }

  static std::shared_future<void> HashedAlready() {
    std::promise<void> done;
    done.set_value();
    return done.get_future().share();
  }

  // Decodes `slot`'s chunks, then (after `previous` is in the hash) hashes them.
  Status DecodeAndHash(Slot& slot, const std::shared_future<void>& previous) {
    Status status;
    for (Piece& p : slot.pieces) {
      status = reader_.DecodeSharedChunk(record_.seq, p.tensor, p.chunk, &p.data);
      if (!status.ok()) break;
    }
    if (status.ok() && slot.band) status = PutTilesTogether(slot);
    previous.wait();
    if (status.ok()) {
      for (const Piece& p : slot.pieces) sha_.Update(*p.data);
    }
    return status;
  }

  // Replaces the decoded chunks of `slot`'s band by the band in row-major order (after caching
  // them as the other chunks are).
  Status PutTilesTogether(Slot& slot) {
    const uint32_t tensor = slot.pieces.front().tensor;
    const ManifestTensor& t = manifest_->tensors[tensor];
    CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());
    auto body = std::make_shared<std::vector<uint8_t>>(slot.bytes);
    for (const Piece& p : slot.pieces) {
      CopyChunkToBox(grid, *slot.band, p.chunk, DTypeSize(t.dtype), *p.data, *body);
      if (cache_as_ && !ctx_.cache->Contains(info_.model, record_.seq, tensor, p.chunk)) {
        ctx_.cache->Put(info_.model, record_.seq, tensor, p.chunk, p.data, *cache_as_,
                        cache_generation_);
      }
    }
    slot.pieces = {Piece{tensor, kBand, std::move(body)}};
    return Status::Ok();
  }

  // Fills `slot` with the next band of tiled tensor tensor_ (ChunkGrid::BandEnd), so that each
  // chunk is decoded once and the tensor is never held whole. The whole tensor when its grid
  // cannot be made (decoding it then says why).
  void ScheduleBand(const ManifestTensor& t, Slot& slot) {
    const uint64_t rows = t.shape.empty() ? 1 : t.shape[0];
    auto grid = t.Grid();
    if (!grid.ok() || t.shape.empty()) {
      for (uint32_t c = 0; c < t.chunk_count; ++c) slot.pieces.push_back({tensor_, c, {}});
      slot.bytes = t.byte_size;
      slot.band = WholeBox(t.shape);
      ++tensor_;
      band_row_ = 0;
      return;
    }
    const uint64_t end = grid->BandEnd(band_row_);
    TensorBox band = WholeBox(t.shape);
    band.offsets[0] = band_row_;
    band.shape[0] = end - band_row_;
    for (const auto& [begin, stop] : grid->ChunkRanges(band)) {
      for (uint32_t c = begin; c < stop; ++c) slot.pieces.push_back({tensor_, c, {}});
    }
    slot.bytes = band.element_count() * DTypeSize(t.dtype);
    slot.band = std::move(band);
    band_row_ = end;
    if (band_row_ == rows) {
      ++tensor_;
      band_row_ = 0;
    }
  }

  // Queues the next chunks in body order, as slots, starting their decoding.
  void Schedule() {
    while (queue_.size() < max_slots_ahead() && bytes_ahead_ < max_ahead_bytes() &&
           tensor_ < manifest_->tensors.size()) {
      Slot& slot = queue_.emplace_back();  // deque: references to other slots stay valid
      while (slot.bytes < min_slot_bytes() && tensor_ < manifest_->tensors.size()) {
        const ManifestTensor& t = manifest_->tensors[tensor_];
        if (chunk_ >= t.chunk_count || record_.Dropped(tensor_)) {
          ++tensor_;
          chunk_ = 0;
          continue;
        }
        if (!t.tile_counts.empty()) {  // a slot of its own, whatever its size
          if (!slot.pieces.empty()) break;
          ScheduleBand(t, slot);
          break;
        }
        slot.pieces.push_back(Piece{tensor_, chunk_, nullptr});
        slot.bytes += ChainReader::ChunkLength(t, chunk_++);
      }
      if (slot.pieces.empty()) {
        queue_.pop_back();
        break;
      }
      bytes_ahead_ += slot.bytes;
      std::promise<void> hashed;
      slot.hashed = hashed.get_future().share();
      if (slot.bytes >= min_slot_bytes()) {
        slot.done = std::async(std::launch::async, [this, &slot, previous = previous_hashed_,
                                                    hashed = std::move(hashed)]() mutable {
          Status status = DecodeAndHash(slot, previous);
          hashed.set_value();
          return status;
        });
      } else {
        // Decoded and hashed by the network thread at its turn, after every slot before it.
        hashed.set_value();
      }
      previous_hashed_ = slot.hashed;
    }
  }

  // Before handing out the last piece, checks the whole body's SHA-256 against the one
  // recorded at push time, so a client never receives a complete body with wrong bytes.
  // Adds the links decoded since the last report to the store's counter: when the last piece
  // is handed out (so the figure is current once a client has the whole body), and for a
  // restore given up early, when it is destroyed.
  void ReportLinksDecoded() {
    if (!use_cache_) return;
    const uint64_t links = reader_.links_decoded();
    ctx_.counters->restore_links_decoded.fetch_add(links - links_reported_,
                                                   std::memory_order_relaxed);
    links_reported_ = links;
  }

  Result<std::span<const uint8_t>> MaybeVerified(std::span<const uint8_t> piece) {
    if (sent_ == record_.raw_bytes) {
      ReportLinksDecoded();
      std::string digest = sha_.FinishHex();
      if (digest != record_.restored_sha256_hex) {
        return Status::DataLoss("model '" + info_.model + "' version " +
                                std::to_string(info_.version) +
                                ": restored body SHA-256 differs from the one recorded at push");
      }
    } else if (sent_ > record_.raw_bytes) {
      return Status::DataLoss("model '" + info_.model + "' version " +
                              std::to_string(info_.version) +
                              ": restored body is longer than recorded");
    }
    return piece;
  }

  const StoreContext& ctx_;
  const ScopedSnapshot snapshot_;  // first: released after everything reading through it
  VersionInfo info_;
  VersionRecord record_;
  const uint64_t cache_generation_;
  const bool use_cache_;
  const bool remote_;  // every chunk read is a round trip
  ChainReader reader_;
  const ManifestRecord* manifest_ = nullptr;
  Sha256 sha_;  // of the body: updated by slots in body order (Slot::hashed)
  std::optional<ReferenceCache::Kind> cache_as_;  // how decoded chunks are cached, if at all
  uint64_t links_reported_ = 0;                   // of reader_.links_decoded(), counted
  bool header_sent_ = false;
  uint32_t tensor_ = 0;
  uint32_t chunk_ = 0;
  uint64_t band_row_ = 0;  // of tiled tensor tensor_: the first row of its next band
  uint64_t sent_ = 0;
  uint64_t bytes_ahead_ = 0;                  // of the slots in queue_
  std::shared_future<void> previous_hashed_;  // of the slot scheduled last
  ReferenceCache::Chunk piece_;               // the chunk handed out last
  std::deque<Slot> queue_;                    // after reader_: destroyed (joined) before it
};

}  // namespace

Result<std::unique_ptr<RestoreStream>> OpenRestoreStream(const StoreContext& ctx,
                                                         ScopedSnapshot snapshot, std::string model,
                                                         VersionInfo info, VersionRecord record,
                                                         uint64_t cache_generation,
                                                         bool use_cache) {
  auto stream = std::make_unique<RestoreStreamImpl>(ctx, std::move(snapshot), std::move(model),
                                                    std::move(info), std::move(record),
                                                    cache_generation, use_cache);
  CKPT_RETURN_IF_ERROR(stream->Init());
  return std::unique_ptr<RestoreStream>(std::move(stream));
}

}  // namespace ckpt
