// The RocksDB-backed CheckpointStore. Schema and commit protocol: docs/design.md.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/backup_engine.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "core/chain_reader.h"
#include "ckpt/codec/hashing.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/safetensors.h"
#include "ckpt/codec/tensor_codec.h"
#include "ckpt/storage/checkpoint_store.h"
#include "core/garbage_collector.h"
#include "records/keys.h"
#include "core/model_chains.h"
#include "core/model_locks.h"
#include "records/records.h"
#include "core/reference_cache.h"
#include "core/store_context.h"
#include "core/worker_pool.h"
#ifdef CKPT_WITH_RADOS
#include "backends/rados/rados_backend.h"
#endif

namespace ckpt {
namespace {

namespace keys = storage_keys;

constexpr char kModelsFamily[] = "models";
constexpr char kVersionsFamily[] = "versions";
constexpr char kManifestsFamily[] = "manifests";
constexpr char kChunksFamily[] = "chunks";
constexpr char kCodecStateFamily[] = "codec_state";
constexpr char kTagsFamily[] = "tags";

// Chunk payloads at least this large live in blob files rather than in the LSM tree.
constexpr uint64_t kMinBlobBytes = 4096;

// SST block sizes. A version record (mostly the pushed safetensors header) and a manifest are a
// few KiB and nearly equal from one version to the next: 64 KiB blocks let zstd code a dozen of
// them together (the versions family's SSTs shrink ~4x against 4 KiB blocks). The chunks family
// holds small payloads and blob references, read in key order by a restore.
constexpr size_t kMetadataBlockBytes = 64 << 10;
constexpr size_t kChunkBlockBytes = 16 << 10;

// Longest label value a version records.
constexpr size_t kMaxLabelBytes = 1024;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string KindName(uint8_t kind) {
  switch (kind) {
    case VersionRecord::kKindKeyframe:
      return "keyframe";
    case VersionRecord::kKindDelta:
      return "delta";
    default:
      return "mixed";
  }
}

VersionInfo MakeVersionInfo(std::string_view model, uint64_t version, const VersionRecord& r) {
  VersionInfo info;
  info.model = std::string(model);
  info.version = version;
  info.kind = KindName(r.kind);
  info.raw_bytes = r.raw_bytes;
  info.stored_bytes = r.stored_bytes;
  info.created_at_ms = r.created_at_ms;
  info.sha256 = r.restored_sha256_hex;
  info.pushed_sha256 = r.sha256_hex;
  info.lossy = r.lossy;
  info.tensor_count = r.tensor_count;
  info.metrics = r.metrics;
  info.labels = r.labels;
  return info;
}

ModelInfo MakeModelInfo(std::string_view model, const ModelRecord& r) {
  ModelInfo info;
  info.name = std::string(model);
  if (r.has_versions) info.latest_version = r.latest_version;
  info.version_count = r.version_count;
  info.raw_bytes = r.raw_bytes;
  info.stored_bytes = r.stored_bytes;
  info.created_at_ms = r.created_at_ms;
  return info;
}

Status BusyModel(std::string_view model) {
  return Status::Aborted("model '" + std::string(model) +
                         "' is busy: a push to it is in progress; pushes to one model are "
                         "serialized, retry when it completes");
}

// Every tag of `model`, by the version it names (names sorted).
Result<std::map<uint64_t, std::vector<std::string>>> TagsByVersion(const StoreContext& ctx,
                                                                   const rocksdb::ReadOptions& ro,
                                                                   std::string_view model) {
  std::map<uint64_t, std::vector<std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(ctx.db->NewIterator(ro, ctx.tags));
  const std::string prefix = keys::ModelPrefix(model);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (it->value().size() != 8) {
      return Status::DataLoss("model '" + std::string(model) + "': malformed tag record");
    }
    out[keys::ReadBigEndian(it->value().ToStringView(), 0, 8)].push_back(
        it->key().ToString().substr(prefix.size()));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing tags"));
  return out;
}

std::string EncodeTagValue(uint64_t version) {
  std::string v;
  keys::AppendBigEndian(v, version, 8);
  return v;
}

// Checks what a push carries besides its body.
Status ValidatePushOptions(const PushOptions& options) {
  for (const auto& [name, value] : options.metrics) {
    CKPT_RETURN_IF_ERROR(ValidateName("metric name", name));
    if (!std::isfinite(value)) {
      return Status::InvalidArgument("metric '" + name + "' must be a finite number");
    }
  }
  for (const auto& [name, value] : options.labels) {
    CKPT_RETURN_IF_ERROR(ValidateName("label name", name));
    if (value.size() > kMaxLabelBytes) {
      return Status::InvalidArgument("label '" + name + "' is longer than " +
                                     std::to_string(kMaxLabelBytes) + " bytes");
    }
  }
  for (const auto& tag : options.tags) CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
  return Status::Ok();
}

// Metrics and labels a body declares in its __metadata__ ("metric.<name>": number as text,
// "label.<name>": text). Entries that do not fit the rules are ignored: the metadata belongs to
// the training job, and other tools write it too.
void ReadMetadataMetrics(const std::map<std::string, std::string>& metadata,
                         std::map<std::string, double>* metrics,
                         std::map<std::string, std::string>* labels) {
  for (const auto& [key, value] : metadata) {
    if (key.starts_with("metric.")) {
      const std::string name = key.substr(7);
      char* end = nullptr;
      const double number = std::strtod(value.c_str(), &end);
      if (ValidateName("metric name", name).ok() && !value.empty() &&
          end == value.c_str() + value.size() && std::isfinite(number)) {
        metrics->emplace(name, number);
      }
    } else if (key.starts_with("label.")) {
      const std::string name = key.substr(6);
      if (ValidateName("label name", name).ok() && value.size() <= kMaxLabelBytes) {
        labels->emplace(name, value);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Push

class PushSessionImpl final : public PushSession, private SafetensorsSink {
 public:
  PushSessionImpl(const StoreContext& ctx, ModelLocks::Guard guard, std::string model,
                  uint64_t version, uint64_t seq, std::optional<uint64_t> body_size,
                  CodecPolicy policy, bool retention_deletes,
                  std::optional<ModelRecord> model_record, std::optional<CodecStateRecord> state,
                  PushOptions options)
      : ctx_(ctx),
        guard_(std::move(guard)),
        model_(std::move(model)),
        version_(version),
        policy_(policy),
        retention_deletes_(retention_deletes),
        push_options_(std::move(options)),
        model_record_(std::move(model_record)),
        state_(state),
        seq_(seq),
        parser_(this, body_size),
        reader_(ctx.db, ctx.manifests, ctx.backend, nullptr, model_, ctx.cache),
        encoder_(std::make_unique<WorkerPool>(
            ctx.options->push_encoder_threads,
            (ctx.options->push_encoder_threads + 1) * ctx.options->chunk_bytes,
            kInlineChunkBytes)) {}

  ~PushSessionImpl() override {
    encoder_.reset();  // waits for the chunks being encoded; drops the queued ones
    if (committed_) return;
    // Abort: remove every chunk this push wrote (best effort: what a crash leaves behind is
    // removed by recovery or garbage collection).
    ctx_.backend->DiscardChunks(model_, ChunkSet::Of(seq_, manifest_));
    ctx_.cache->DropModelExcept(model_, state_ ? state_->reference_seq : 0);
  }

  Status Write(std::span<const uint8_t> bytes) override {
    if (committed_) return Status::FailedPrecondition("push already committed");
    sha_.Update(bytes);
    return parser_.Feed(bytes);
  }

  Result<VersionInfo> Commit() override {
    if (committed_) return Status::FailedPrecondition("push already committed");
    CKPT_RETURN_IF_ERROR(parser_.Finish());
    CKPT_RETURN_IF_ERROR(encoder_->Drain());
    HashRestoredChunks();

    VersionRecord vr;
    vr.seq = seq_;
    vr.floor_seq = manifest_.floor_seq;
    vr.created_at_ms = NowMs();
    vr.raw_bytes = parser_.consumed();
    vr.tensor_count = static_cast<uint32_t>(manifest_.tensors.size());
    vr.sha256_hex = sha_.FinishHex();
    vr.restored_sha256_hex = restored_is_pushed_ ? vr.sha256_hex : restored_sha_.FinishHex();
    vr.raw_header = std::move(raw_header_);
    vr.metrics = push_options_.metrics;
    vr.labels = push_options_.labels;
    for (size_t i = 0; i < manifest_.tensors.size(); ++i) {
      ManifestTensor& t = manifest_.tensors[i];
      // In chunk order, whatever order the encoders finished in: the same sum every time.
      for (double bits : chunk_entropy_bits_[i]) t.entropy_bits += bits;
      vr.lossy |= t.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized);
      if (t.kind == FrameKind::kKeyframe) {
        t.keyframe_bytes = t.stored_bytes;
        t.chain_bytes = 0;
      } else {
        t.chain_bytes += t.stored_bytes;  // OnHeader set it to the reference's
      }
    }
    vr.kind = VersionRecord::KindOf(manifest_);

    manifest_.version = version_;
    manifest_.stored_bytes = stored_bytes_;
    std::string manifest_bytes = manifest_.Encode();
    manifest_.stored_bytes += manifest_bytes.size() + vr.raw_header.size();
    manifest_bytes = manifest_.Encode();
    vr.stored_bytes = manifest_.stored_bytes;

    CodecStateRecord state{seq_, manifest_.floor_seq, seq_ + 1};
    ModelRecord model = model_record_.value_or(ModelRecord{});
    if (!model_record_) model.created_at_ms = vr.created_at_ms;
    model.has_versions = true;
    model.latest_version = version_;
    model.version_count += 1;
    model.raw_bytes += vr.raw_bytes;
    model.stored_bytes += vr.stored_bytes;

    ModelChange change;
    change.refers_to_new_chunks = true;
    rocksdb::WriteBatch& batch = change.batch;
    batch.Put(ctx_.manifests, keys::ManifestKey(model_, seq_), manifest_bytes);
    batch.Put(ctx_.versions, keys::VersionKey(model_, version_), vr.Encode());
    batch.Put(ctx_.codec_state, model_, state.Encode());
    batch.Put(ctx_.models, model_, model.Encode());
    for (const std::string& tag : push_options_.tags) {
      batch.Put(ctx_.tags, keys::TagKey(model_, tag), EncodeTagValue(version_));
    }
    {
      std::lock_guard tags_lock(*ctx_.tags_mu);
      CKPT_RETURN_IF_ERROR(ctx_.backend->Commit(model_, change, "committing version"));
    }
    committed_ = true;
    ctx_.counters->pushes.fetch_add(1, std::memory_order_relaxed);
    ctx_.counters->push_raw_bytes.fetch_add(vr.raw_bytes, std::memory_order_relaxed);
    ctx_.counters->push_stored_bytes.fetch_add(vr.stored_bytes, std::memory_order_relaxed);
    // The former reference's chunks stay as restored chunks (a restore of the version before
    // this one, the usual rollback after a loss spike, then replays nothing).
    ctx_.cache->DemoteModelExcept(model_, seq_);
    VersionInfo info = MakeVersionInfo(model_, version_, vr);
    info.tags = push_options_.tags;
    std::sort(info.tags.begin(), info.tags.end());
    info.tags.erase(std::unique(info.tags.begin(), info.tags.end()), info.tags.end());
    return info;
  }

 private:
  Status OnHeader(const SafetensorsHeader& header, std::string_view raw_header) override {
    raw_header_ = std::string(raw_header);
    ReadMetadataMetrics(header.metadata, &push_options_.metrics, &push_options_.labels);
    restored_sha_.Update(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(raw_header.data()), raw_header.size()));
    const ManifestRecord* reference = nullptr;
    std::unordered_map<std::string_view, uint32_t> reference_index;
    if (state_) {
      CKPT_ASSIGN_OR_RETURN(reference, reader_.Manifest(state_->reference_seq));
      for (uint32_t i = 0; i < reference->tensors.size(); ++i) {
        reference_index.emplace(reference->tensors[i].name, i);
      }
    }
    if (header.tensors.size() > ctx_.options->max_tensors_per_checkpoint) {
      return Status::ResourceExhausted("checkpoint has " + std::to_string(header.tensors.size()) +
                                       " tensors; the limit is " +
                                       std::to_string(ctx_.options->max_tensors_per_checkpoint) +
                                       " (storage.max_tensors_per_checkpoint)");
    }
    manifest_.floor_seq = seq_;
    const uint32_t keyframe_every = policy_.EffectiveKeyframeEvery();
    restored_is_pushed_ = true;
    for (const auto& t : header.tensors) {
      TensorCoding coding = policy_.ForTensor(t.name, t.dtype, t.shape);
      // Lattice versions with element history cost more to re-encode exactly (their states go
      // along): a model whose retention deletes versions is coded without it.
      if (coding.lossy && coding.lossy_options.lattice && retention_deletes_) {
        coding.lossy_options.history = false;
      }
      tensor_codecs_.push_back(CodecFor(coding));
      restored_is_pushed_ &= !coding.lossy;
      ManifestTensor mt;  // codec_id: lossless until a chunk is stored quantized
      mt.name = t.name;
      mt.dtype = t.dtype;
      mt.shape = t.shape;
      mt.byte_size = t.byte_size();
      const uint64_t element = DTypeSize(t.dtype);
      // A tensor that fits in one chunk records its own size, so its chunk geometry (and
      // with it the ability to delta) survives a change of the configured chunk size.
      mt.chunk_bytes = std::min(std::max(element, ctx_.options->chunk_bytes / element * element),
                                std::max(element, mt.byte_size));
      const uint64_t chunks = (mt.byte_size + mt.chunk_bytes - 1) / mt.chunk_bytes;
      if (chunks > std::numeric_limits<uint32_t>::max()) {
        return Status::InvalidArgument("tensor '" + t.name + "' is too large");
      }
      mt.chunk_count = static_cast<uint32_t>(chunks);
      chunk_entropy_bits_.emplace_back(mt.chunk_count, 0.0);
      mt.kind = FrameKind::kKeyframe;
      mt.keyframe_seq = seq_;
      if (auto it = reference_index.find(t.name); it != reference_index.end()) {
        const ManifestTensor& rt = reference->tensors[it->second];
        // Lossy chains also restart once their deltas outweigh their keyframe by the policy's
        // budget: that bounds what a restore reads and what a chain keeps alive.
        const bool chain_outweighs_keyframe =
            coding.lossy && policy_.KeyframeBudgetExceeded(rt.keyframe_bytes, rt.chain_bytes);
        if (rt.dtype == mt.dtype && rt.shape == mt.shape && rt.chunk_bytes == mt.chunk_bytes &&
            mt.byte_size > 0 && rt.chain_length + 1 < keyframe_every && !chain_outweighs_keyframe &&
            ReferenceAvailable(coding, it->second, mt.chunk_count)) {
          mt.LinkTo(state_->reference_seq, it->second, rt);
        }
      }
      manifest_.floor_seq = std::min(manifest_.floor_seq, mt.keyframe_seq);
      manifest_.tensors.push_back(std::move(mt));
    }
    return Status::Ok();
  }

  // Whether a delta against tensor `reference_tensor` of the reference manifest can be encoded
  // without replaying its chain: all its chunks are in the reference cache, or the store is
  // configured to decode misses. Lossy tensors always decode misses: their keyframes cost many
  // deltas, while replaying a lossy chain is fast.
  bool ReferenceAvailable(const TensorCoding& coding, uint32_t reference_tensor,
                          uint32_t chunk_count) const {
    if (coding.lossy) return true;
    if (ctx_.options->on_reference_miss == StoreOptions::ReferenceMiss::kDecode) return true;
    for (uint32_t c = 0; c < chunk_count; ++c) {
      if (!ctx_.cache->Contains(model_, state_->reference_seq, reference_tensor, c)) return false;
    }
    return true;
  }

  Status OnTensorData(size_t index, std::span<const uint8_t> bytes) override {
    const ManifestTensor& t = manifest_.tensors[index];
    while (!bytes.empty()) {
      const uint64_t length = ChainReader::ChunkLength(t, chunk_index_);
      if (pending_.empty() && bytes.size() >= length) {
        CKPT_RETURN_IF_ERROR(EmitChunk(static_cast<uint32_t>(index), bytes.first(length)));
        bytes = bytes.subspan(length);
        continue;
      }
      const size_t take = std::min<uint64_t>(bytes.size(), length - pending_.size());
      pending_.insert(pending_.end(), bytes.begin(), bytes.begin() + take);
      bytes = bytes.subspan(take);
      if (pending_.size() == length) {
        CKPT_RETURN_IF_ERROR(EmitChunk(static_cast<uint32_t>(index), pending_));
        pending_.clear();
      }
    }
    return Status::Ok();
  }

  Status OnTensorEnd(size_t index) override {
    if (chunk_index_ != manifest_.tensors[index].chunk_count || !pending_.empty()) {
      return Status::Internal("push: tensor '" + manifest_.tensors[index].name +
                              "' ended mid-chunk");
    }
    chunk_index_ = 0;
    return Status::Ok();
  }

  // Queues a complete chunk of the body for EncodeChunk on the encoder thread.
  Status EmitChunk(uint32_t tensor, std::span<const uint8_t> data) {
    HashRestoredChunks();
    const uint32_t chunk = chunk_index_++;
    const uint64_t ordinal = body_chunks_++;
    return encoder_->Submit(data, [this, tensor, chunk, ordinal](std::span<const uint8_t> bytes) {
      return EncodeChunk(tensor, chunk, ordinal, bytes);
    });
  }

  // Encodes chunk `chunk` of tensor `tensor` (the body's chunk number `ordinal`) against its
  // reference, stores it and accounts for it. Runs on an encoder thread, concurrently with
  // other chunks of the body (storage.push_encoder_threads), or inline.
  Status EncodeChunk(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                     std::span<const uint8_t> data) {
    const ManifestTensor& t = manifest_.tensors[tensor];
    std::optional<std::span<const uint8_t>> reference;
    ReferenceCache::Chunk cached;
    std::vector<uint8_t> decoded;
    if (t.kind == FrameKind::kDelta) {
      cached = ctx_.cache->Get(model_, t.base_seq, t.base_tensor, chunk);
      if (cached) {
        reference = std::span<const uint8_t>(*cached);
        // Consumed: the new version's chunk replaces it as the reference, and demoting it now
        // keeps the LRU from evicting reference chunks this push still needs. (Evicted under a
        // race, a reference is decoded from the chain below.)
        ctx_.cache->Demote(model_, t.base_seq, t.base_tensor, chunk);
      } else {
        CKPT_RETURN_IF_ERROR(reader_.DecodeChunk(t.base_seq, t.base_tensor, chunk, &decoded));
        reference = std::span<const uint8_t>(decoded);
      }
    }
    const TensorCodec* codec = tensor_codecs_[tensor];
    const auto encode_start = std::chrono::steady_clock::now();
    CKPT_ASSIGN_OR_RETURN(EncodedChunk encoded, codec->Encode(t.dtype, data, reference));
    ctx_.counters->encode_ns.fetch_add(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - encode_start)
                                  .count()),
        std::memory_order_relaxed);
    // What a restore will produce: the input itself, or the lossy reconstruction.
    const std::span<const uint8_t> restored =
        encoded.reconstruction_is_input ? data : std::span<const uint8_t>(encoded.reconstruction);
    const std::string value = ChunkRecord::EncodeChunk(encoded, t.kind, restored);
    CKPT_RETURN_IF_ERROR(ctx_.backend->PutChunk(model_, seq_, tensor, chunk, value));
    if (restored_is_pushed_ && !encoded.reconstruction_is_input) {
      return Status::Internal("push: the lossless codec changed chunk " + std::to_string(chunk) +
                              " of tensor '" + t.name + "'");
    }
    chunk_entropy_bits_[tensor][chunk] = encoded.info.model_entropy_bits;  // this chunk's slot
    {
      std::lock_guard lock(accounting_mu_);
      stored_bytes_ += value.size();
      ManifestTensor& entry = manifest_.tensors[tensor];
      if (encoded.codec_id == CodecId::kLossyQuantized) {
        entry.codec_id = static_cast<uint16_t>(encoded.codec_id);
      }
      entry.stored_bytes += value.size();
      entry.quantizer = std::max(entry.quantizer, encoded.info.quantizer);
      entry.bound = std::max(entry.bound, encoded.info.bound);
      entry.exact_elements += encoded.info.exact_elements;
    }
    ReferenceCache::Chunk reconstruction =
        encoded.reconstruction_is_input
            ? std::make_shared<const std::vector<uint8_t>>(data.begin(), data.end())
            : std::make_shared<const std::vector<uint8_t>>(std::move(encoded.reconstruction));
    if (!restored_is_pushed_) {
      std::lock_guard lock(unhashed_mu_);
      unhashed_.emplace(ordinal, reconstruction);
    }
    ctx_.cache->Put(model_, seq_, tensor, chunk, std::move(reconstruction));
    return Status::Ok();
  }

  // Adds to restored_sha_ the reconstructions the encoders have finished that continue the
  // body where the last call stopped (a chunk finished out of order waits for the ones before
  // it). On the network thread, which has time to spare while the encoders work.
  void HashRestoredChunks() {
    std::vector<ReferenceCache::Chunk> chunks;
    {
      std::lock_guard lock(unhashed_mu_);
      for (auto it = unhashed_.begin(); it != unhashed_.end() && it->first == next_to_hash_;
           it = unhashed_.erase(it), ++next_to_hash_) {
        chunks.push_back(std::move(it->second));
      }
    }
    for (const ReferenceCache::Chunk& chunk : chunks) restored_sha_.Update(*chunk);
  }

  // The codec of a tensor: the store's lossless codec, or a lossy codec for the tensor's
  // options (one instance per distinct options in this push).
  const TensorCodec* CodecFor(const TensorCoding& coding) {
    if (!coding.lossy) return ctx_.codec;
    for (const auto& [options, codec] : lossy_codecs_) {
      if (options == coding.lossy_options) {
        return codec.get();
      }
    }
    lossy_codecs_.emplace_back(coding.lossy_options, NewLossyCodec(coding.lossy_options));
    return lossy_codecs_.back().second.get();
  }

  const StoreContext& ctx_;
  ModelLocks::Guard guard_;
  const std::string model_;
  const uint64_t version_;
  const CodecPolicy policy_;
  const bool retention_deletes_;  // the model's retention policy has rules (RetentionOf)
  PushOptions push_options_;
  std::vector<std::pair<LossyCodecOptions, std::unique_ptr<TensorCodec>>> lossy_codecs_;
  std::vector<const TensorCodec*> tensor_codecs_;  // per tensor of the body
  const std::optional<ModelRecord> model_record_;
  const std::optional<CodecStateRecord> state_;
  const uint64_t seq_;
  SafetensorsStreamParser parser_;
  ChainReader reader_;
  Sha256 sha_;  // of the pushed body
  // Of the body a restore will send, unless restored_is_pushed_: the header, then the chunks'
  // reconstructions as the encoder thread hands them over in unhashed_.
  Sha256 restored_sha_;
  // Every tensor is coded losslessly: a restore sends the pushed body itself (the parser admits
  // no byte outside the header and the tensors), whose SHA-256 sha_ computes anyway.
  bool restored_is_pushed_ = false;
  std::string raw_header_;
  ManifestRecord manifest_;
  std::vector<uint8_t> pending_;
  uint32_t chunk_index_ = 0;  // within its tensor, of the next chunk EmitChunk receives
  uint64_t body_chunks_ = 0;  // chunks EmitChunk received, over all tensors
  // Per tensor and chunk, written by EncodeChunk (each chunk its own slot), summed by Commit.
  std::vector<std::vector<double>> chunk_entropy_bits_;
  // Encodes the chunks while the network thread receives and hashes the next ones (a push
  // uses 1 + storage.push_encoder_threads cores), at most one chunk's bytes waiting beyond
  // those being encoded. EncodeChunk writes manifest_'s per-tensor figures and stored_bytes_
  // under accounting_mu_; Commit reads them after Drain.
  std::unique_ptr<WorkerPool> encoder_;
  std::mutex accounting_mu_;
  // Chunks smaller than this are encoded on the connection's thread when the encoder is idle.
  static constexpr size_t kInlineChunkBytes = 16 << 10;
  std::mutex unhashed_mu_;
  // Finished reconstructions not hashed yet, by body chunk number; guarded by unhashed_mu_.
  std::map<uint64_t, ReferenceCache::Chunk> unhashed_;
  uint64_t next_to_hash_ = 0;  // the body chunk number HashRestoredChunks hashes next
  uint64_t stored_bytes_ = 0;
  bool committed_ = false;
};

// ---------------------------------------------------------------------------------------------
// Restore

class RestoreStreamImpl final : public RestoreStream {
 public:
  // Takes ownership of `snapshot`; `cache_generation` is the reference cache's generation read
  // before the snapshot was taken. With `use_cache` false every chunk is decoded from storage
  // and the reference cache is left alone (scrub).
  RestoreStreamImpl(const StoreContext& ctx, const rocksdb::Snapshot* snapshot, std::string model,
                    VersionInfo info, VersionRecord record, uint64_t cache_generation,
                    bool use_cache = true)
      : ctx_(ctx),
        snapshot_(snapshot),
        info_(std::move(info)),
        record_(std::move(record)),
        cache_generation_(cache_generation),
        use_cache_(use_cache),
        reader_(ctx.db, ctx.manifests, ctx.backend, snapshot, std::move(model),
                use_cache ? ctx.cache : nullptr, cache_generation) {}

  ~RestoreStreamImpl() override {
    queue_.clear();  // waits for prefetches still reading through the snapshot
    ReportLinksDecoded();
    ctx_.db->ReleaseSnapshot(snapshot_);
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
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot_;
    CKPT_ASSIGN_OR_RETURN(auto state, ctx_.GetRecord<CodecStateRecord>(ro, ctx_.codec_state,
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
  const rocksdb::Snapshot* snapshot_;
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

// ---------------------------------------------------------------------------------------------
// Store

class RocksCheckpointStore final : public CheckpointStore {
 public:
  explicit RocksCheckpointStore(const StoreOptions& options)
      : options_(options),
        cache_(options.reference_cache_bytes),
        codec_(NewLosslessCodec(LosslessCodecOptions{options.zstd_level})) {}

  ~RocksCheckpointStore() override {
    if (!db_) return;
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db_->Close().PermitUncheckedError();
  }

  Status OpenDb() {
    rocksdb::DBOptions db_options;
    db_options.create_if_missing = true;
    db_options.create_missing_column_families = true;
    db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
    db_options.keep_log_file_num = 2;
    db_options.max_background_jobs = 2;
    // Old WAL files are kept alive by the smallest family's memtable; cap their total so the
    // metadata families get flushed and the WAL does not grow with the chunk traffic.
    db_options.max_total_wal_size = 256ull << 20;

    rocksdb::ColumnFamilyOptions meta;
    meta.compression = rocksdb::kZSTD;
    rocksdb::BlockBasedTableOptions meta_table;
    meta_table.block_size = kMetadataBlockBytes;
    meta.table_factory.reset(rocksdb::NewBlockBasedTableFactory(meta_table));
    meta.write_buffer_size = 8 << 20;

    rocksdb::ColumnFamilyOptions chunks;
    // Large payloads go to blob files as they are (already entropy-coded); the LSM tree holds
    // small payloads and blob references, whose headers and keys compress well.
    chunks.compression = rocksdb::kZSTD;
    rocksdb::BlockBasedTableOptions chunk_table;
    chunk_table.block_size = kChunkBlockBytes;
    chunks.table_factory.reset(rocksdb::NewBlockBasedTableFactory(chunk_table));
    chunks.enable_blob_files = true;
    chunks.min_blob_size = kMinBlobBytes;
    chunks.blob_file_size = 256ull << 20;
    chunks.blob_compression_type = rocksdb::kNoCompression;
    chunks.enable_blob_garbage_collection = true;
    // Memtables hold chunk values until they are flushed into blob files: 2 x 32 MiB bounds
    // that memory while keeping flushes large.
    chunks.write_buffer_size = 32 << 20;
    chunks.max_write_buffer_number = 2;

    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, meta},
        {kModelsFamily, meta},
        {kVersionsFamily, meta},
        {kManifestsFamily, meta},
        {kChunksFamily, chunks},
        {kCodecStateFamily, meta},
        {kTagsFamily, meta},
    };
    rocksdb::DB* raw = nullptr;
    CKPT_RETURN_IF_ERROR(
        FromRocks(rocksdb::DB::Open(db_options, options_.data_dir, families, &handles_, &raw),
                  "opening RocksDB at '" + options_.data_dir + "'"));
    db_.reset(raw);
    ctx_.db = raw;
    ctx_.models = handles_[1];
    ctx_.versions = handles_[2];
    ctx_.manifests = handles_[3];
    chunks_ = handles_[4];
    ctx_.codec_state = handles_[5];
    ctx_.tags = handles_[6];
    ctx_.tags_mu = &tags_mu_;
    if (options_.cluster) {
#ifdef CKPT_WITH_RADOS
      MetadataFamilies metadata{ctx_.models, ctx_.versions, ctx_.manifests, ctx_.codec_state,
                                ctx_.tags};
      CKPT_ASSIGN_OR_RETURN(backend_, NewRadosBackend(raw, metadata, *options_.cluster));
#else
      return Status::InvalidArgument(
          "store: a cluster is configured but this build has no RADOS support (CKPT_WITH_RADOS)");
#endif
    } else {
      backend_ = NewLocalBackend(raw, chunks_, options_.sync_commits);
    }
    ctx_.backend = backend_.get();
    ctx_.cache = &cache_;
    ctx_.codec = codec_.get();
    ctx_.options = &options_;
    ctx_.counters = &counters_;
    // With a cluster, recovery is the owner's business: interrupted pushes leave orphan chunks
    // that its garbage collection removes.
    if (!backend_->IsLocal()) return Status::Ok();
    CKPT_RETURN_IF_ERROR(RemoveInterruptedPushes());
    return RemoveOrphanedManifests();
  }

  Result<std::unique_ptr<PushSession>> BeginPush(std::string_view model, uint64_t version,
                                                 std::optional<uint64_t> body_size,
                                                 const PushOptions& options) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(ValidatePushOptions(options));
    ModelLocks::Guard guard = locks_.TryLock(model);
    if (!guard) return BusyModel(model);
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
    rocksdb::ReadOptions ro;
    CKPT_ASSIGN_OR_RETURN(auto record,
                          ctx_.GetRecord<ModelRecord>(ro, ctx_.models, name, "model record"));
    if (record && record->has_versions && version <= record->latest_version) {
      return Status::FailedPrecondition(
          "version " + std::to_string(version) + " must be greater than the latest version " +
          std::to_string(record->latest_version) + " of model '" + name + "'");
    }
    if (!record) CKPT_RETURN_IF_ERROR(CheckModelLimit());
    CKPT_ASSIGN_OR_RETURN(
        auto state, ctx_.GetRecord<CodecStateRecord>(ro, ctx_.codec_state, name, "codec state"));
    CodecPolicy policy = options_.default_policy;
    if (record && !record->policy_json.empty()) {
      CKPT_ASSIGN_OR_RETURN(policy, CodecPolicy::FromJson(record->policy_json, policy));
    }
    CKPT_ASSIGN_OR_RETURN(
        const RetentionPolicy retention,
        record ? RetentionOf(*record) : Result<RetentionPolicy>(options_.default_retention));
    const uint64_t seq = std::max(state ? state->next_seq : 1, backend_->SeqFloor(name));
    return std::unique_ptr<PushSession>(
        new PushSessionImpl(ctx_, std::move(guard), name, version, seq, body_size, policy,
                            !retention.KeepsEverything(), std::move(record), state, options));
  }

  Result<std::unique_ptr<RestoreStream>> OpenRestore(std::string_view model,
                                                     std::optional<uint64_t> version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const uint64_t cache_generation = cache_.generation();  // before the snapshot
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot;
    auto found = FindVersion(ro, model, version);
    if (!found.ok()) {
      db_->ReleaseSnapshot(snapshot);
      return found.status();
    }
    auto& [number, record] = *found;
    auto stream = std::make_unique<RestoreStreamImpl>(ctx_, snapshot, std::string(model),
                                                      MakeVersionInfo(model, number, record),
                                                      record, cache_generation);
    CKPT_RETURN_IF_ERROR(stream->Init());
    return std::unique_ptr<RestoreStream>(std::move(stream));
  }

  Result<std::vector<ModelInfo>> ListModels() override {
    std::vector<ModelInfo> out;
    CKPT_ASSIGN_OR_RETURN(auto names, backend_->ListModelNames());
    if (names) {  // the cluster's index
      CKPT_RETURN_IF_ERROR(backend_->RefreshMany(*names));
      for (const std::string& name : *names) {
        auto record =
            ctx_.GetRecord<ModelRecord>(rocksdb::ReadOptions(), ctx_.models, name, "model record");
        if (!record.ok()) return record.status().WithContext("model '" + name + "'");
        if (*record) out.push_back(MakeModelInfo(name, **record));
      }
      return out;
    }
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), ctx_.models));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto record = ModelRecord::Decode(it->value().ToStringView());
      if (!record.ok()) return record.status().WithContext("model '" + it->key().ToString() + "'");
      out.push_back(MakeModelInfo(it->key().ToStringView(), *record));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing models"));
    return out;
  }

  Result<ModelInfo> GetModel(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(auto record, RequireModel(rocksdb::ReadOptions(), model));
    return MakeModelInfo(model, record);
  }

  Result<std::vector<VersionInfo>> ListVersions(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot;
    auto result = ListVersionsAt(ro, model);
    db_->ReleaseSnapshot(snapshot);
    return result;
  }

  Result<VersionInfo> GetVersion(std::string_view model, std::optional<uint64_t> version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot;
    auto result = [&]() -> Result<VersionInfo> {
      CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ro, model, version));
      CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, ro, model));
      VersionInfo info = MakeVersionInfo(model, found.first, found.second);
      info.tags = std::move(tags[found.first]);
      return info;
    }();
    db_->ReleaseSnapshot(snapshot);
    return result;
  }

  Result<VersionDetail> GetVersionDetail(std::string_view model,
                                         std::optional<uint64_t> version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot;
    auto result = [&]() -> Result<VersionDetail> {
      CKPT_ASSIGN_OR_RETURN(auto found, FindVersion(ro, model, version));
      ChainReader reader(ctx_.db, ctx_.manifests, ctx_.backend, snapshot, std::string(model),
                         nullptr);
      CKPT_ASSIGN_OR_RETURN(const ManifestRecord* manifest, reader.Manifest(found.second.seq));
      VersionDetail detail;
      detail.info = MakeVersionInfo(model, found.first, found.second);
      CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, ro, model));
      detail.info.tags = std::move(tags[found.first]);
      for (const ManifestTensor& t : manifest->tensors) {
        TensorDetail d;
        d.name = t.name;
        d.dtype = std::string(DTypeName(t.dtype));
        d.shape = t.shape;
        d.kind = t.kind == FrameKind::kKeyframe ? "keyframe" : "delta";
        const bool lossy = t.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized);
        d.codec = lossy ? "lossy" : "lossless";
        if (lossy) d.quantizer = std::string(QuantizerName(static_cast<Quantizer>(t.quantizer)));
        d.bound = t.bound;
        d.chain_length = t.chain_length;
        d.raw_bytes = t.byte_size;
        d.stored_bytes = t.stored_bytes;
        d.exact_elements = t.exact_elements;
        const uint64_t elements = t.byte_size / DTypeSize(t.dtype);
        if (elements > 0) {
          d.bits_per_element = 8.0 * static_cast<double>(t.stored_bytes) / elements;
          d.entropy_bits_per_element = t.entropy_bits / static_cast<double>(elements);
        }
        detail.tensors.push_back(std::move(d));
      }
      return detail;
    }();
    db_->ReleaseSnapshot(snapshot);
    return result;
  }

  Status DeleteVersion(std::string_view model, uint64_t version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    ModelLocks::Guard guard = locks_.TryLock(model);
    if (!guard) return BusyModel(model);
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
    std::lock_guard tags_lock(tags_mu_);
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
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
    // Manifests still needed: those of the remaining versions and of the codec state's
    // reference (the next push deltas against it), with every link of their chains.
    CKPT_ASSIGN_OR_RETURN(auto needed, chains.NeededSeqs(chains.LiveSeqs(version)));
    ModelChange change;
    change.batch.Delete(ctx_.versions, keys::VersionKey(name, version));
    const ModelChains::Removal removal = chains.RemoveUnneeded(ctx_, needed, &change);
    ModelRecord& record = chains.record;
    record.version_count -= 1;
    record.raw_bytes -= victim->second.raw_bytes;
    record.stored_bytes -= std::min(record.stored_bytes, removal.bytes);
    chains.versions.erase(victim);
    record.has_versions = !chains.versions.empty();
    record.latest_version = record.has_versions ? chains.versions.rbegin()->first : 0;
    change.batch.Put(ctx_.models, name, record.Encode());
    CKPT_RETURN_IF_ERROR(backend_->Commit(name, change, "deleting version"));
    counters_.versions_deleted.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  Status DeleteModel(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    ModelLocks::Guard guard = locks_.TryLock(model);
    if (!guard) return BusyModel(model);
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
    std::lock_guard tags_lock(tags_mu_);
    CKPT_RETURN_IF_ERROR(RequireModel(rocksdb::ReadOptions(), model).status());
    ModelChange change;
    change.whole_model = true;
    change.batch.Delete(ctx_.models, name);
    change.batch.Delete(ctx_.codec_state, name);
    for (auto* cf : {ctx_.versions, ctx_.manifests, ctx_.tags}) {
      change.batch.DeleteRange(cf, keys::ModelPrefix(name), keys::ModelPrefixEnd(name));
    }
    if (!backend_->IsLocal()) {  // the local backend drops the model's whole chunk range
      CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                            ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
      for (const auto& [seq, manifest] : chains.manifests) {
        change.unreachable.push_back(ChunkSet::Of(seq, manifest));
      }
    }
    CKPT_RETURN_IF_ERROR(backend_->Commit(name, change, "deleting model"));
    cache_.DropModelExcept(name, 0);
    return Status::Ok();
  }

  Result<CodecPolicy> GetPolicy(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(ModelRecord record, RequireModel(rocksdb::ReadOptions(), model));
    if (record.policy_json.empty()) return options_.default_policy;
    return CodecPolicy::FromJson(record.policy_json, options_.default_policy);
  }

  Status SetPolicy(std::string_view model, const CodecPolicy& policy) override {
    return UpdateModelRecord(model, "setting policy",
                             [&](ModelRecord& r) { r.policy_json = policy.ToJson(); });
  }

  Status SetTag(std::string_view model, std::string_view tag, uint64_t version) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
    std::lock_guard tags_lock(tags_mu_);
    CKPT_RETURN_IF_ERROR(FindVersion(rocksdb::ReadOptions(), model, version).status());
    ModelChange change;
    change.batch.Put(ctx_.tags, keys::TagKey(model, tag), EncodeTagValue(version));
    return backend_->Commit(name, change, "setting tag");
  }

  Status RemoveTag(std::string_view model, std::string_view tag) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
    std::lock_guard tags_lock(tags_mu_);
    CKPT_RETURN_IF_ERROR(ResolveTag(model, tag).status());
    ModelChange change;
    change.batch.Delete(ctx_.tags, keys::TagKey(model, tag));
    return backend_->Commit(name, change, "removing tag");
  }

  Result<uint64_t> ResolveTag(std::string_view model, std::string_view tag) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(ValidateName("tag", tag));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    std::string value;
    rocksdb::Status s =
        db_->Get(rocksdb::ReadOptions(), ctx_.tags, keys::TagKey(model, tag), &value);
    if (s.IsNotFound()) {
      CKPT_RETURN_IF_ERROR(RequireModel(rocksdb::ReadOptions(), model).status());
      return Status::NotFound("model '" + std::string(model) + "' has no tag '" + std::string(tag) +
                              "'");
    }
    CKPT_RETURN_IF_ERROR(FromRocks(s, "reading tag"));
    if (value.size() != 8) return Status::DataLoss("malformed tag record");
    return keys::ReadBigEndian(value, 0, 8);
  }

  Result<RetentionPolicy> GetRetentionPolicy(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    CKPT_RETURN_IF_ERROR(backend_->Refresh(std::string(model)));
    CKPT_ASSIGN_OR_RETURN(ModelRecord record, RequireModel(rocksdb::ReadOptions(), model));
    return RetentionOf(record);
  }

  Status SetRetentionPolicy(std::string_view model, const RetentionPolicy& policy) override {
    return UpdateModelRecord(model, "setting retention policy",
                             [&](ModelRecord& r) { r.retention_json = policy.ToJson(); });
  }

  Result<RetentionReport> ApplyRetention(std::string_view model, const RetentionRun& run) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    const std::string name(model);
    RetentionReport report;
    report.model = name;
    report.dry_run = run.dry_run;
    {
      ModelLocks::Guard guard = locks_.LockWithin(model, run.lock_wait);
      if (!guard) return BusyModel(model);
      CKPT_RETURN_IF_ERROR(run.dry_run ? backend_->Refresh(name) : backend_->ClaimWrites(name));
      std::unique_lock tags_lock(tags_mu_);
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
        change.batch.Put(ctx_.models, name, chains.record.Encode());
        CKPT_RETURN_IF_ERROR(backend_->Commit(name, change, "deleting versions by retention"));
        counters_.retention_versions_deleted.fetch_add(report.deleted.size(),
                                                       std::memory_order_relaxed);
      }
      tags_lock.unlock();
      CKPT_ASSIGN_OR_RETURN(report.gc, CollectModelGarbage(ctx_, chains, run.gc));
      CKPT_ASSIGN_OR_RETURN(report.gc.orphan_chunks_removed, RemoveOrphanChunks(name));
    }
    CKPT_ASSIGN_OR_RETURN(report.gc.compacted,
                          MaybeCompact(name, report.gc.bytes_freed, run.gc.compaction));
    return report;
  }

  Result<ScrubReport> Scrub(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->Refresh(name));
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot;
    ro.verify_checksums = true;
    auto result = ScrubAt(ro, name);
    db_->ReleaseSnapshot(snapshot);
    return result;
  }

  Result<BackupResult> Backup(const std::string& backup_dir) override {
    if (backup_dir.empty()) return Status::InvalidArgument("backup: directory is empty");
    if (!backend_->IsLocal()) {
      return Status::FailedPrecondition(
          "backup: the data is in the Ceph cluster (the data directory is only a cache); back up "
          "the pool with Ceph's tools");
    }
    rocksdb::BackupEngine* raw = nullptr;
    CKPT_RETURN_IF_ERROR(
        FromRocks(rocksdb::BackupEngine::Open(rocksdb::BackupEngineOptions(backup_dir),
                                              rocksdb::Env::Default(), &raw),
                  "opening backup directory '" + backup_dir + "'"));
    std::unique_ptr<rocksdb::BackupEngine> engine(raw);
    rocksdb::CreateBackupOptions create;
    rocksdb::BackupID id = 0;
    CKPT_RETURN_IF_ERROR(FromRocks(
        engine->CreateNewBackupWithMetadata(create, db_.get(), "ckptd", &id), "creating backup"));
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

  Result<GcReport> CollectGarbage(std::string_view model, const GcOptions& options) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    const std::string name(model);
    GcReport report;
    {
      ModelLocks::Guard guard = locks_.TryLock(model);
      if (!guard) return BusyModel(model);
      CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
      CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                            ModelChains::Load(ctx_, rocksdb::ReadOptions(), name));
      CKPT_ASSIGN_OR_RETURN(report, CollectModelGarbage(ctx_, chains, options));
      CKPT_ASSIGN_OR_RETURN(report.orphan_chunks_removed, RemoveOrphanChunks(name));
    }
    // Outside the lock: pushes may proceed while the freed range is compacted.
    CKPT_ASSIGN_OR_RETURN(report.compacted,
                          MaybeCompact(name, report.bytes_freed, options.compaction));
    return report;
  }

  Result<std::optional<std::string>> WriteOwner(std::string_view model) override {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    return backend_->WriteOwner(std::string(model));
  }

  StoreStats Stats() override {
    StoreStats s;
    auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    s.pushes = get(counters_.pushes);
    s.push_raw_bytes = get(counters_.push_raw_bytes);
    s.push_stored_bytes = get(counters_.push_stored_bytes);
    s.encode_seconds = static_cast<double>(get(counters_.encode_ns)) * 1e-9;
    s.versions_deleted = get(counters_.versions_deleted);
    s.retention_versions_deleted = get(counters_.retention_versions_deleted);
    s.gc_bytes_freed = get(counters_.gc_bytes_freed);
    s.gc_versions_rebased = get(counters_.gc_versions_rebased);
    s.restores = get(counters_.restores);
    s.restore_links_decoded = get(counters_.restore_links_decoded);
    auto sum = [this](const std::string& property) {
      uint64_t total = 0;
      for (rocksdb::ColumnFamilyHandle* cf : handles_) {
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
    backend_->AddStats(&s);
    return s;
  }

  Status Flush() override {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    std::vector<rocksdb::ColumnFamilyHandle*> all(handles_.begin(), handles_.end());
    CKPT_RETURN_IF_ERROR(FromRocks(db_->Flush(fo, all), "flushing memtables"));
    return FromRocks(db_->FlushWAL(/*sync=*/true), "syncing WAL");
  }

 private:
  Result<ScrubReport> ScrubAt(const rocksdb::ReadOptions& ro, const std::string& name) {
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
    Status listed = backend_->ForEachChunk(
        ro, name, next_seq,
        [&](uint64_t seq, uint32_t tensor, uint32_t chunk, std::string_view value) {
          auto manifest = chains.manifests.find(seq);
          if (manifest == chains.manifests.end()) {
            ++report.orphaned_chunks;
            return;
          }
          ++report.chunks_checked;
          report.bytes_checked += value.size();
          auto record = ChunkRecord::Decode(value);
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
      const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
      rocksdb::ReadOptions now;
      now.snapshot = snapshot;
      auto found = FindVersion(now, name, version);
      if (!found.ok() && found.status().code() == StatusCode::kNotFound) {
        db_->ReleaseSnapshot(snapshot);
        continue;
      }
      ++report.versions_checked;
      Status restored = [&]() -> Status {
        if (!found.ok()) {
          db_->ReleaseSnapshot(snapshot);
          return found.status();
        }
        const VersionRecord& record = found->second;
        auto stream = std::make_unique<RestoreStreamImpl>(
            ctx_, snapshot, name, MakeVersionInfo(name, version, record), record,
            ReferenceCache::kAnyGeneration, /*use_cache=*/false);
        CKPT_RETURN_IF_ERROR(stream->Init());
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

  // Applies `change` to the model's record under its lock, creating the model (without
  // versions) if needed.
  Status UpdateModelRecord(std::string_view model, std::string_view what,
                           const std::function<void(ModelRecord&)>& change) {
    CKPT_RETURN_IF_ERROR(ValidateModelName(model));
    ModelLocks::Guard guard = locks_.TryLock(model);
    if (!guard) return BusyModel(model);
    const std::string name(model);
    CKPT_RETURN_IF_ERROR(backend_->ClaimWrites(name));
    CKPT_ASSIGN_OR_RETURN(
        auto record,
        ctx_.GetRecord<ModelRecord>(rocksdb::ReadOptions(), ctx_.models, name, "model record"));
    if (!record) CKPT_RETURN_IF_ERROR(CheckModelLimit());
    ModelRecord updated = record.value_or(ModelRecord{});
    if (!record) updated.created_at_ms = NowMs();
    change(updated);
    ModelChange commit;
    commit.batch.Put(ctx_.models, name, updated.Encode());
    return backend_->Commit(name, commit, what);
  }

  // FailedPrecondition when the store already holds options_.max_models models (counts at most
  // that many keys).
  Status CheckModelLimit() {
    if (options_.max_models == 0) return Status::Ok();
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), ctx_.models));
    uint64_t count = 0;
    for (it->SeekToFirst(); it->Valid() && count < options_.max_models; it->Next()) ++count;
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "counting models"));
    if (count < options_.max_models) return Status::Ok();
    return Status::FailedPrecondition("the store holds the maximum of " +
                                      std::to_string(options_.max_models) +
                                      " models (storage.max_models): delete a model or raise "
                                      "the limit");
  }

  Result<RetentionPolicy> RetentionOf(const ModelRecord& record) const {
    if (record.retention_json.empty()) return options_.default_retention;
    return RetentionPolicy::FromJson(record.retention_json);
  }

  Result<ModelRecord> RequireModel(const rocksdb::ReadOptions& ro, std::string_view model) {
    CKPT_ASSIGN_OR_RETURN(auto record, ctx_.GetRecord<ModelRecord>(
                                           ro, ctx_.models, std::string(model), "model record"));
    if (!record) return Status::NotFound("model '" + std::string(model) + "' not found");
    return std::move(*record);
  }

  Result<std::pair<uint64_t, VersionRecord>> FindVersion(const rocksdb::ReadOptions& ro,
                                                         std::string_view model,
                                                         std::optional<uint64_t> version) {
    CKPT_ASSIGN_OR_RETURN(ModelRecord record, RequireModel(ro, model));
    if (!version) {
      if (!record.has_versions) {
        return Status::NotFound("model '" + std::string(model) + "' has no versions");
      }
      version = record.latest_version;
    }
    CKPT_ASSIGN_OR_RETURN(
        auto vr, ctx_.GetRecord<VersionRecord>(ro, ctx_.versions, keys::VersionKey(model, *version),
                                               "version record"));
    if (!vr) {
      return Status::NotFound("model '" + std::string(model) + "' has no version " +
                              std::to_string(*version));
    }
    return std::make_pair(*version, std::move(*vr));
  }

  Result<std::vector<VersionInfo>> ListVersionsAt(const rocksdb::ReadOptions& ro,
                                                  std::string_view model) {
    CKPT_RETURN_IF_ERROR(RequireModel(ro, model).status());
    CKPT_ASSIGN_OR_RETURN(auto tags, TagsByVersion(ctx_, ro, model));
    std::vector<VersionInfo> out;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, ctx_.versions));
    const std::string prefix = keys::ModelPrefix(model);
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      auto vr = VersionRecord::Decode(it->value().ToStringView());
      if (!vr.ok()) return vr.status().WithContext("model '" + std::string(model) + "'");
      const uint64_t number = keys::NumberAfterPrefix(it->key().ToStringView(), model.size());
      out.push_back(MakeVersionInfo(model, number, *vr));
      if (auto t = tags.find(number); t != tags.end()) out.back().tags = std::move(t->second);
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing versions"));
    return out;
  }

  // Chunk records of `model` that no stored push owns (interrupted pushes of this or a former
  // owner). Under the model's lock, so no push of ours is in progress.
  Result<uint64_t> RemoveOrphanChunks(const std::string& model) {
    if (backend_->IsLocal()) return uint64_t{0};
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), model));
    std::set<uint64_t> stored;
    for (const auto& [seq, manifest] : chains.manifests) stored.insert(seq);
    const uint64_t next_seq = chains.codec_state ? chains.codec_state->next_seq : 1;
    return backend_->RemoveOrphanChunks(model, stored,
                                        std::max(next_seq, backend_->SeqFloor(model)));
  }

  // Records `freed` bytes of the model as awaiting compaction and, per `compaction`, compacts
  // when any await it. Runs outside the model lock: pushes proceed meanwhile. Returns whether it
  // compacted.
  Result<bool> MaybeCompact(const std::string& model, uint64_t freed,
                            GcOptions::Compaction compaction) {
    {
      std::lock_guard lock(freed_mu_);
      uint64_t& pending = freed_since_compaction_[model];
      pending += freed;
      if (compaction == GcOptions::Compaction::kNone || pending == 0 || !backend_->IsLocal()) {
        return false;
      }
      pending = 0;
    }
    CKPT_RETURN_IF_ERROR(CompactModelChunks(model, compaction == GcOptions::Compaction::kFull));
    return true;
  }

  // Rewrites the model's chunk key range, dropping deleted entries (blob files left holding only
  // deleted data go with them); `force_blob_gc` also moves the blobs still referenced out of blob
  // files that hold garbage, so that those are removed too.
  Status CompactModelChunks(const std::string& model, bool force_blob_gc) {
    rocksdb::CompactRangeOptions cro;
    if (force_blob_gc) {
      cro.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
      cro.blob_garbage_collection_age_cutoff = 1.0;
    }
    cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    const std::string begin = keys::ModelPrefix(model), end = keys::ModelPrefixEnd(model);
    const rocksdb::Slice begin_slice(begin), end_slice(end);
    return FromRocks(db_->CompactRange(cro, chunks_, &begin_slice, &end_slice),
                     "compacting chunks of model '" + model + "'");
  }

  // Recovery, second part: manifests no version needs any more, left by a crash between a
  // garbage-collection rebase and its cleanup. Removes them; a model whose records cannot be
  // read is left alone for the scrub to report.
  Status RemoveOrphanedManifests() {
    std::vector<std::string> models;
    {
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), ctx_.models));
      for (it->SeekToFirst(); it->Valid(); it->Next()) models.push_back(it->key().ToString());
      CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "listing models for recovery"));
    }
    GcOptions sweep;
    sweep.rebase_min_dead_fraction = -1;
    sweep.compaction = GcOptions::Compaction::kNone;
    for (const std::string& model : models) {
      auto chains = ModelChains::Load(ctx_, rocksdb::ReadOptions(), model);
      if (!chains.ok()) continue;
      auto swept = CollectModelGarbage(ctx_, *chains, sweep);
      if (swept.ok()) orphaned_manifests_removed_ += swept->manifests_removed;
    }
    return Status::Ok();
  }

  // Recovery: chunks written by a push or a garbage-collection rebase that never committed
  // (crash, kill -9) lie at or beyond their model's committed next_seq. Remove them.
  Status RemoveInterruptedPushes() {
    rocksdb::ReadOptions ro;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, chunks_));
    rocksdb::WriteBatch batch;
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
        batch.DeleteRange(chunks_, keys::ChunkSeqBegin(model, next_seq),
                          keys::ModelPrefixEnd(model));
        ++interrupted_pushes_removed_;
      }
      it->Seek(keys::ModelPrefixEnd(model));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "scanning chunks for recovery"));
    if (batch.Count() == 0) return Status::Ok();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Write(wo, &batch), "removing interrupted pushes");
  }

  StoreOptions options_;
  ReferenceCache cache_;
  std::unique_ptr<TensorCodec> codec_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* chunks_ = nullptr;  // the local backend's chunk records
  std::unique_ptr<StoreBackend> backend_;
  StoreContext ctx_;
  StoreCounters counters_;
  ModelLocks locks_;
  std::mutex tags_mu_;  // see StoreContext::tags_mu
  std::mutex freed_mu_;
  std::unordered_map<std::string, uint64_t> freed_since_compaction_;  // guarded by freed_mu_
  uint64_t interrupted_pushes_removed_ = 0;
  uint64_t orphaned_manifests_removed_ = 0;
};

}  // namespace

Status CheckpointStore::RestoreBackup(const std::string& backup_dir, const std::string& data_dir) {
  if (backup_dir.empty() || data_dir.empty()) {
    return Status::InvalidArgument("restore-backup: backup and data directories are required");
  }
  std::error_code ec;
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

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(const StoreOptions& options) {
  if (options.data_dir.empty()) return Status::InvalidArgument("store: data_dir is empty");
  if (options.chunk_bytes < 1024) {
    return Status::InvalidArgument("store: chunk_bytes must be at least 1024");
  }
  auto store = std::make_unique<RocksCheckpointStore>(options);
  CKPT_RETURN_IF_ERROR(store->OpenDb());
  return std::unique_ptr<CheckpointStore>(std::move(store));
}

}  // namespace ckpt
