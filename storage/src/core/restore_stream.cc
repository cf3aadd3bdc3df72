// The restore stream (restore_stream.h).
#include "core/restore_stream.h"

#include <deque>
#include <future>
#include <optional>
#include <span>

#include "ckpt/codec/hashing.h"
#include "core/chain_reader.h"
#include "core/reference_cache.h"

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
        reader_(ctx.db, ctx.manifests, ctx.backend, snapshot_.get(), std::move(model),
                use_cache ? ctx.cache : nullptr, cache_generation) {}

  ~RestoreStreamImpl() override {
    queue_.clear();  // waits for prefetches still reading through the snapshot
    ReportLinksDecoded();
  }

  Status Init() {
    if (use_cache_) ctx_.counters->restores.fetch_add(1, std::memory_order_relaxed);
    CKPT_ASSIGN_OR_RETURN(manifest_, reader_.Manifest(record_.seq));
    // Restoring the version the next push deltas against (the usual `latest` after a restart):
    // its decoded chunks are exactly the reference cache's content, so keep them there; the next
    // restore of it and the next push then need no chain replay. Any other version is kept as
    // restored chunks, evicted before references: restoring the versions of a chain in turn (an
    // evaluation sweep) then replays one link per version instead of the whole chain. Only for
    // versions that fit in half the cache, so one large restore does not flush every other
    // model's references.
    CKPT_ASSIGN_OR_RETURN(auto state,
                          ctx_.GetRecord<CodecStateRecord>(snapshot_.reads(), ctx_.codec_state,
                                                           info_.model, "codec state"));
    if (use_cache_ && record_.raw_bytes <= ctx_.cache->budget_bytes() / 2) {
      cache_as_ = state && state->reference_seq == record_.seq ? ReferenceCache::Kind::kReference
                                                               : ReferenceCache::Kind::kRestored;
    }
    return Status::Ok();
  }

  const VersionInfo& info() const override { return info_; }
  uint64_t size() const override { return record_.raw_bytes; }

  Result<std::span<const uint8_t>> Next() override {
    if (!header_sent_) {
      header_sent_ = true;
      std::span<const uint8_t> header(reinterpret_cast<const uint8_t*>(record_.raw_header.data()),
                                      record_.raw_header.size());
      sha_.Update(header);
      sent_ += header.size();
      return MaybeVerified(header);
    }
    Schedule();
    if (queue_.empty()) return std::span<const uint8_t>();
    Slot& slot = queue_.front();
    Status decoded = slot.done.valid() ? slot.done.get()
                                       : reader_.DecodeSharedChunk(record_.seq, slot.tensor,
                                                                   slot.chunk, &slot.data);
    piece_ = std::move(slot.data);
    const uint32_t tensor = slot.tensor, chunk = slot.chunk;
    queue_.pop_front();
    CKPT_RETURN_IF_ERROR(decoded);
    if (cache_as_ && !ctx_.cache->Contains(info_.model, record_.seq, tensor, chunk)) {
      // The cache shares the buffer being sent (both only read it).
      ctx_.cache->Put(info_.model, record_.seq, tensor, chunk, piece_, *cache_as_,
                      cache_generation_);
    }
    Schedule();  // the next chunks decode while this one is being sent
    sha_.Update(*piece_);
    sent_ += piece_->size();
    return MaybeVerified(*piece_);
  }

 private:
  // One chunk of the body, decoded ahead on a worker thread when it is large enough to pay for
  // the thread, or inline when its turn comes.
  struct Slot {
    uint32_t tensor = 0;
    uint32_t chunk = 0;
    ReferenceCache::Chunk data;
    std::future<Status> done;  // valid when decoding asynchronously
  };
  // Chunks decoded ahead of the one being sent: uses a second core while the network thread
  // writes, and bounds the memory to this many extra chunks.
  static constexpr size_t kPrefetchDepth = 2;
  static constexpr uint64_t kMinPrefetchBytes = 256 << 10;

  // Queues the next chunks in body order, starting asynchronous decodes for large ones.
  void Schedule() {
    while (queue_.size() < kPrefetchDepth && tensor_ < manifest_->tensors.size()) {
      const ManifestTensor& t = manifest_->tensors[tensor_];
      if (chunk_ >= t.chunk_count) {
        ++tensor_;
        chunk_ = 0;
        continue;
      }
      Slot& slot = queue_.emplace_back();  // deque: references to other slots stay valid
      slot.tensor = tensor_;
      slot.chunk = chunk_++;
      if (ChainReader::ChunkLength(t, slot.chunk) >= kMinPrefetchBytes) {
        ReferenceCache::Chunk* out = &slot.data;
        slot.done =
            std::async(std::launch::async, [this, tensor = slot.tensor, chunk = slot.chunk, out] {
              return reader_.DecodeSharedChunk(record_.seq, tensor, chunk, out);
            });
      }
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
  ChainReader reader_;
  const ManifestRecord* manifest_ = nullptr;
  Sha256 sha_;
  std::optional<ReferenceCache::Kind> cache_as_;  // how decoded chunks are cached, if at all
  uint64_t links_reported_ = 0;                   // of reader_.links_decoded(), counted
  bool header_sent_ = false;
  uint32_t tensor_ = 0;
  uint32_t chunk_ = 0;
  uint64_t sent_ = 0;
  ReferenceCache::Chunk piece_;  // the chunk handed out last
  std::deque<Slot> queue_;       // after reader_: destroyed (joined) before it
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
