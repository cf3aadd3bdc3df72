// The push session (push_session.h).
#include "write/push_session.h"

#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "chains/model_chains.h"
#include "ckpt/base/hashing.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/codec/encoded_body.h"
#include "read/catalog.h"
#include "read/chain_reader.h"
#include "records/keys.h"
#include "write/push_encoder.h"
#include "write/push_plan.h"

namespace ckpt {
namespace {

namespace keys = storage_keys;

// Longest label value a version records.
constexpr size_t kMaxLabelBytes = 1024;

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

// How much body a push receives between two checks of the free-space reserve.
constexpr uint64_t kReserveCheckBytes = 8ull << 20;

// Versions storing at least this much get chunk files of their own at their commit.
constexpr uint64_t kSealedVersionBytes = 64 << 10;

// The longest chunk record an encoded body may carry: a chunk stored raw, with room to spare.
uint64_t MaxEncodedRecordBytes(const StoreContext& ctx) {
  return 2 * ctx.options->chunk_bytes + (1 << 20);
}

// What a push session is fed: a safetensors body, an encoded push body, or the chunks of an
// assembled sharded version (ChunkedPush).
enum class PushFeed { kSafetensors, kEncoded, kChunks };

// What a push whose body `options` describe is fed.
PushFeed FeedOf(const PushOptions& options) {
  return options.body_format == PushBodyFormat::kEncoded ? PushFeed::kEncoded
                                                         : PushFeed::kSafetensors;
}

class PushSessionImpl final : public PushSession,
                              public ChunkedPush,
                              private SafetensorsSink,
                              private EncodedBodySink {
 public:
  PushSessionImpl(const StoreContext& ctx, ModelLocks::Guard guard, PushTarget target,
                  std::optional<uint64_t> body_size, PushOptions options, PushFeed feed)
      : ctx_(ctx),
        guard_(std::move(guard)),
        target_(std::move(target)),
        model_(target_.model),
        version_(target_.version),
        push_options_(std::move(options)),
        state_(target_.state),
        seq_(target_.seq),
        feed_(feed),
        encoded_(feed == PushFeed::kEncoded),
        parser_(this, body_size),
        encoded_parser_(this, kMaxSafetensorsHeaderBytes, MaxEncodedRecordBytes(ctx)),
        reader_(ctx.db, ctx.manifests, ctx.backend, nullptr, model_, ctx.cache),
        encoder_(std::make_unique<PushEncoder>(
            ctx, model_, seq_, &reader_, &manifest_,
            /*hash_every_restored_chunk=*/feed != PushFeed::kSafetensors)) {
    // A chunked version's restored digest is computed here, from every chunk decoded.
    if (feed_ == PushFeed::kChunks) push_options_.decode_encoded_payloads = true;
  }

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
    if (feed_ == PushFeed::kChunks) return Status::Internal("push: a chunked push takes no body");
    CKPT_RETURN_IF_ERROR(CountReceived(bytes.size()));
    if (encoded_) return encoded_parser_.Feed(bytes);
    sha_.Update(bytes);
    return parser_.Feed(bytes);
  }

  Result<VersionInfo> Commit() override {
    if (committed_) return Status::FailedPrecondition("push already committed");
    switch (feed_) {
      case PushFeed::kSafetensors:
        CKPT_RETURN_IF_ERROR(parser_.Finish());
        break;
      case PushFeed::kEncoded:
        CKPT_RETURN_IF_ERROR(encoded_parser_.Finish());
        break;
      case PushFeed::kChunks:
        if (!started_ || next_tensor_ < manifest_.tensors.size()) {
          return Status::Internal("push: the assembled version ended before its last chunk");
        }
        break;
    }
    Result<uint64_t> finished = encoder_->Finish();
    if (!finished.ok() && feed_ == PushFeed::kChunks) return WithShard(finished.status());
    CKPT_ASSIGN_OR_RETURN(const uint64_t stored_bytes, std::move(finished));

    VersionRecord vr;
    vr.seq = seq_;
    vr.floor_seq = manifest_.floor_seq;
    vr.created_at_ms = NowMs();
    vr.tensor_count = static_cast<uint32_t>(manifest_.tensors.size());
    if (encoded_) {
      CKPT_RETURN_IF_ERROR(CheckEncodedDigests());
      vr.raw_bytes = raw_header_.size() + data_size_;
      vr.sha256_hex = claimed_.pushed_sha256;
      vr.restored_sha256_hex = claimed_.restored_sha256;
    } else if (feed_ == PushFeed::kChunks) {
      vr.raw_bytes = raw_header_.size() + data_size_;
      vr.restored_sha256_hex = encoder_->RestoredSha256Hex();
      // Nobody saw the assembled body whole: known only when it is what a restore sends.
      if (encoder_->restored_is_pushed()) vr.sha256_hex = vr.restored_sha256_hex;
    } else {
      vr.raw_bytes = parser_.consumed();
      vr.sha256_hex = sha_.FinishHex();
      vr.restored_sha256_hex =
          encoder_->restored_is_pushed() ? vr.sha256_hex : encoder_->RestoredSha256Hex();
    }
    vr.raw_header = std::move(raw_header_);
    vr.metrics = push_options_.metrics;
    vr.labels = push_options_.labels;
    for (size_t i = 0; i < manifest_.tensors.size(); ++i) {
      ManifestTensor& t = manifest_.tensors[i];
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
    manifest_.stored_bytes = stored_bytes;
    std::string manifest_bytes = Encoded(manifest_);
    manifest_.stored_bytes += manifest_bytes.size() + vr.raw_header.size();
    manifest_bytes = Encoded(manifest_);
    vr.stored_bytes = manifest_.stored_bytes;

    CodecStateRecord state{seq_, manifest_.floor_seq, seq_ + 1};
    ModelRecord model = target_.model_record.value_or(ModelRecord{});
    if (!target_.model_record) model.created_at_ms = vr.created_at_ms;
    model.has_versions = true;
    model.latest_version = version_;
    model.version_count += 1;
    model.raw_bytes += vr.raw_bytes;
    model.stored_bytes += vr.stored_bytes;

    ModelChange change;
    change.refers_to_new_chunks = true;
    CKPT_ASSIGN_OR_RETURN(const uint64_t removed_bytes,
                          RemoveReferenceIfUnneeded(vr, state, &change));
    model.stored_bytes -= std::min(model.stored_bytes, removed_bytes);
    rocksdb::WriteBatch& batch = change.batch;
    batch.Put(ctx_.manifests, keys::ManifestKey(model_, seq_), manifest_bytes);
    batch.Put(ctx_.versions, keys::VersionKey(model_, version_), Encoded(vr));
    batch.Put(ctx_.codec_state, model_, Encoded(state));
    batch.Put(ctx_.models, model_, Encoded(model));
    for (const std::string& tag : push_options_.tags) {
      batch.Put(ctx_.tags, keys::TagKey(model_, tag), Encoded(TagRecord{version_}));
    }
    // Outside tags_mu, so that other models' commits need not wait for it.
    CKPT_RETURN_IF_ERROR(ctx_.backend->PersistChunkWrites(model_));
    {
      std::lock_guard tags_lock(*ctx_.tags_mu);
      CKPT_RETURN_IF_ERROR(ctx_.backend->Commit(model_, change, "committing version"));
    }
    committed_ = true;
    // The version's records go to files of their own: the rearrangement after the push
    // replaces its forward deltas (and the keyframes of the version before), and files holding
    // only those leave the disk whole, where files shared with the pushes before would keep the
    // dead bytes until blob garbage collection copied the live ones out. A small version is
    // left with the next (a file each would cost more in tables than it could leave behind).
    // Best effort: a seal that fails only leaves the records where they are.
    if (vr.stored_bytes >= kSealedVersionBytes) (void)ctx_.backend->SealChunkWrites(model_);
    ctx_.counters->pushes.fetch_add(1, std::memory_order_relaxed);
    ctx_.counters->push_raw_bytes.fetch_add(vr.raw_bytes, std::memory_order_relaxed);
    ctx_.counters->push_stored_bytes.fetch_add(vr.stored_bytes, std::memory_order_relaxed);
    // The former reference's chunks stay as restored chunks (a restore of the version before
    // this one, the usual rollback after a loss spike, then replays nothing).
    ctx_.cache->DemoteModelExcept(model_, seq_);
    // The model is free from here on: what follows a push (its rearrangement) may start while
    // the answer is on its way.
    guard_ = ModelLocks::Guard();
    VersionInfo info = MakeVersionInfo(model_, version_, vr);
    info.tags = push_options_.tags;
    std::sort(info.tags.begin(), info.tags.end());
    info.tags.erase(std::unique(info.tags.begin(), info.tags.end()), info.tags.end());
    return info;
  }

 private:
  // A reference whose version was deleted is kept while a chain needs it. When this version,
  // the new reference (`state`, described by `vr`), ends that (it started new chains) and no
  // older chain runs through it, its removal, and that of what only it needed, joins `change`:
  // the commit leaves nothing that no version needs. Returns the stored bytes removed.
  Result<uint64_t> RemoveReferenceIfUnneeded(const VersionRecord& vr, const CodecStateRecord& state,
                                             ModelChange* change) {
    if (!state_) return uint64_t{0};
    CKPT_ASSIGN_OR_RETURN(const std::optional<VersionRecord> owner,
                          ctx_.GetRecord<VersionRecord>(
                              rocksdb::ReadOptions(), ctx_.versions,
                              keys::VersionKey(model_, reference_version_), "version record"));
    if (owner && owner->seq == state_->reference_seq) return uint64_t{0};
    CKPT_ASSIGN_OR_RETURN(ModelChains chains,
                          ModelChains::Load(ctx_, rocksdb::ReadOptions(), model_));
    chains.manifests[seq_] = manifest_;
    chains.versions[version_] = vr;
    chains.codec_state = state;
    CKPT_ASSIGN_OR_RETURN(const ModelChains::Removal removal,
                          chains.RemoveNoLongerNeeded(ctx_, change));
    return removal.bytes;
  }

  Status OnHeader(const SafetensorsHeader& header, std::string_view raw_header) override {
    raw_header_ = std::string(raw_header);
    ReadMetadataMetrics(header.metadata, &push_options_.metrics, &push_options_.labels);
    encoder_->AddHeader(raw_header);
    // A sharded version (and a restored one pushed again whole) is planned as its ranks plan
    // their shards.
    const std::optional<PlanSharding> sharding = ShardingOf(header);
    CKPT_ASSIGN_OR_RETURN(planned_, PlanPush(ctx_, target_, reader_, header, raw_header.size(),
                                             sharding ? &*sharding : nullptr));
    reference_version_ = planned_.reference_version;
    manifest_.floor_seq = planned_.floor_seq;
    for (size_t i = 0; i < planned_.tensors.size(); ++i) {
      encoder_->AddTensor(planned_.codings[i], planned_.tensors[i].chunk_count);
      manifest_.tensors.push_back(planned_.tensors[i]);
    }
    return Status::Ok();
  }

  // ChunkedPush: the assembled version's header, and the shards ranks coded, whose plans must
  // still be the model's.
  Result<CodingPlan> Start(std::string_view raw_header, std::span<const CodedShard> coded,
                           uint32_t shard_count) override {
    if (started_) return Status::Internal("push: started twice");
    started_ = true;
    CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header, ParseRawSafetensorsHeader(raw_header));
    CKPT_RETURN_IF_ERROR(OnHeader(header, raw_header));
    for (const ManifestTensor& t : manifest_.tensors) data_size_ += t.byte_size;
    plan_ = ToCodingPlan(target_, planned_, "");
    const uint64_t reference = state_ ? state_->reference_seq : 0;
    for (const CodedShard& shard : coded) {
      CKPT_ASSIGN_OR_RETURN(const CodingPlan shard_plan,
                            ShardPlanOf(target_, planned_, *shard.header, shard_count, {}));
      if (shard.reference != reference || shard.plan_digest != shard_plan.Digest()) {
        return Status::StalePlan(
            "shard " + std::to_string(shard.header->shard) + " of version " +
            std::to_string(version_) + " of model '" + model_ +
            "' was coded by a plan the model no longer codes by (a version was pushed or the "
            "policy changed since it arrived): every rank asks for a new plan of its shard and "
            "sends it again");
      }
    }
    NextExpectedChunk();
    return plan_;
  }

  Status RawChunk(uint32_t tensor, uint32_t chunk, std::span<const uint8_t> bytes) override {
    CKPT_RETURN_IF_ERROR(ExpectChunk(tensor, chunk));
    CKPT_RETURN_IF_ERROR(CountReceived(bytes.size()));
    if (bytes.size() != ChainReader::ChunkLength(manifest_.tensors[tensor], chunk)) {
      return Status::Internal("push: an assembled chunk of the wrong length");
    }
    CKPT_RETURN_IF_ERROR(WithShard(encoder_->Submit(tensor, chunk, bytes)));
    ++next_chunk_;
    NextExpectedChunk();
    return Status::Ok();
  }

  Status CodedChunk(uint32_t tensor, uint32_t chunk, std::string_view record,
                    const ChunkCodingInfo& info, uint32_t shard) override {
    CKPT_RETURN_IF_ERROR(ExpectChunk(tensor, chunk));
    CKPT_RETURN_IF_ERROR(CountReceived(record.size()));
    coded_by_[{tensor, chunk}] = shard;
    Status s = OnChunk(EncodedChunkFrame{tensor, chunk, info, record});
    // Refused before it reached the encoder (its record no longer reads): this shard's.
    if (s.code() == StatusCode::kInvalidArgument && !encoder_->refused_chunk()) {
      refused_shard_ = shard;
    }
    return WithShard(std::move(s));
  }

  std::optional<uint32_t> RefusedShard() const override { return refused_shard_; }

  // An error of the chunked push: when it is the refusal of a rank's record (decoded on an
  // encoder thread, reported by a later call), it names that record's shard.
  Status WithShard(Status s) {
    if (s.code() != StatusCode::kInvalidArgument) return s;
    if (auto refused = encoder_->refused_chunk()) {
      if (auto it = coded_by_.find(*refused); it != coded_by_.end()) refused_shard_ = it->second;
    }
    if (!refused_shard_) return s;
    std::string message = "shard " + std::to_string(*refused_shard_) + " of version " +
                          std::to_string(version_) + ", coded by its rank: " + s.message() +
                          " (the shard is dropped from the upload: its rank pulls its part of "
                          "the base and sends the shard again)";
    return s.subcode() == StatusSubcode::kReferenceDrifted
               ? Status::ReferenceDrifted(std::move(message))
               : Status::InvalidArgument(std::move(message));
  }

  // BeginPush checked the body's announced size against the reserve; bodies of unknown size
  // and concurrent pushes are caught here, as the volume reaches it.
  Status CountReceived(uint64_t bytes) {
    unchecked_bytes_ += bytes;
    if (unchecked_bytes_ < kReserveCheckBytes) return Status::Ok();
    unchecked_bytes_ = 0;
    return ctx_.health->CheckPush(0);
  }

  // A chunked push's chunks come in body order.
  Status ExpectChunk(uint32_t tensor, uint32_t chunk) const {
    if (!started_ || tensor != next_tensor_ || chunk != next_chunk_) {
      return Status::Internal("push: assembled chunks out of order");
    }
    return Status::Ok();
  }

  // The encoded body's preamble: the checkpoint's header, and the reference and plan it was
  // coded by, which must still be the model's.
  Status OnPreamble(const EncodedBodyPreamble& preamble) override {
    CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header,
                          ParseRawSafetensorsHeader(preamble.raw_header));
    const uint64_t reference = state_ ? state_->reference_seq : 0;
    if (preamble.reference != reference) {
      return Status::StalePlan("the encoded push was coded against reference " +
                               std::to_string(preamble.reference) + ", and model '" + model_ +
                               "' now deltas against " + std::to_string(reference) +
                               ": ask for a new plan (and pull its base) and encode again");
    }
    CKPT_RETURN_IF_ERROR(OnHeader(header, preamble.raw_header));
    for (const ManifestTensor& t : manifest_.tensors) data_size_ += t.byte_size;
    plan_ = ToCodingPlan(target_, planned_, "");
    if (plan_.Digest() != preamble.plan_digest) {
      return Status::StalePlan("the encoded push follows a plan that model '" + model_ +
                               "' no longer codes by (its policy or chunk size changed since): "
                               "ask for a new plan and encode again");
    }
    NextExpectedChunk();
    return Status::Ok();
  }

  // One chunk of the encoded body: the next one of the plan, of the coding it names.
  Status OnChunk(const EncodedChunkFrame& frame) override {
    if (next_tensor_ >= manifest_.tensors.size()) {
      return Status::InvalidArgument("encoded push: a chunk after the last one of the plan");
    }
    const ManifestTensor& t = manifest_.tensors[next_tensor_];
    const std::string where = "encoded push: chunk " + std::to_string(frame.chunk) + " of tensor " +
                              std::to_string(frame.tensor);
    if (frame.tensor != next_tensor_ || frame.chunk != next_chunk_) {
      return Status::InvalidArgument(where + " came where the plan has chunk " +
                                     std::to_string(next_chunk_) + " of tensor " +
                                     std::to_string(next_tensor_) + " ('" + t.name + "')");
    }
    auto record = ChunkRecord::DecodeFrom(frame.record);
    if (!record.ok()) return Status::InvalidArgument(where + ": " + record.status().message());
    // The manifest's figures are the payload header's (the entropy, which no header carries, is
    // what the client's encoder reported).
    ChunkCodingInfo info = frame.info;
    const Status follows =
        CheckChunkFollowsPlan(plan_.tensors[next_tensor_], next_chunk_, *record, &info);
    if (!follows.ok()) {
      return Status::InvalidArgument(where + " ('" + t.name + "'): " + follows.message());
    }
    CKPT_RETURN_IF_ERROR(encoder_->SubmitEncoded(next_tensor_, next_chunk_, frame.record, info,
                                                 push_options_.decode_encoded_payloads));
    ++next_chunk_;
    NextExpectedChunk();
    return Status::Ok();
  }

  Status OnEnd(const EncodedBodyEnd& end) override {
    if (next_tensor_ < manifest_.tensors.size()) {
      return Status::InvalidArgument("encoded push: the body ended before chunk " +
                                     std::to_string(next_chunk_) + " of tensor '" +
                                     manifest_.tensors[next_tensor_].name + "'");
    }
    claimed_ = end;
    return Status::Ok();
  }

  // Moves next_tensor_ and next_chunk_ past the tensors whose chunks all came (or that have
  // none).
  void NextExpectedChunk() {
    while (next_tensor_ < manifest_.tensors.size() &&
           next_chunk_ == manifest_.tensors[next_tensor_].chunk_count) {
      ++next_tensor_;
      next_chunk_ = 0;
    }
  }

  // The digests an encoded body ends with: the restored body's is the one the store computed
  // when it decoded the payloads; a body coded losslessly throughout restores to itself.
  Status CheckEncodedDigests() {
    if (encoder_->restored_is_pushed() && claimed_.restored_sha256 != claimed_.pushed_sha256) {
      return Status::InvalidArgument(
          "encoded push: every tensor is lossless, yet the restored body's digest is not the "
          "pushed body's");
    }
    if (push_options_.decode_encoded_payloads) {
      const std::string restored = encoder_->RestoredSha256Hex();
      if (restored != claimed_.restored_sha256) {
        return Status::InvalidArgument("encoded push: the payloads restore to a body of SHA-256 " +
                                       restored + ", not the " + claimed_.restored_sha256 +
                                       " the client computed");
      }
    }
    return Status::Ok();
  }

  Status OnTensorData(size_t index, std::span<const uint8_t> bytes) override {
    const ManifestTensor& t = manifest_.tensors[index];
    if (!t.tile_counts.empty()) {  // cut in tiles once it is whole (OnTensorEnd)
      pending_.insert(pending_.end(), bytes.begin(), bytes.end());
      return Status::Ok();
    }
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
    if (!manifest_.tensors[index].tile_counts.empty()) {
      CKPT_RETURN_IF_ERROR(EmitTiles(static_cast<uint32_t>(index)));
    }
    if (chunk_index_ != manifest_.tensors[index].chunk_count || !pending_.empty()) {
      return Status::Internal("push: tensor '" + manifest_.tensors[index].name +
                              "' ended mid-chunk");
    }
    chunk_index_ = 0;
    return Status::Ok();
  }

  // Hands the chunks of tiled tensor `tensor`, whole in pending_, to the encoder.
  Status EmitTiles(uint32_t tensor) {
    const ManifestTensor& t = manifest_.tensors[tensor];
    CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());
    if (pending_.size() != t.byte_size) {
      return Status::Internal("push: tensor '" + t.name + "' ended short");
    }
    const TensorBox whole = WholeBox(t.shape);
    std::vector<uint8_t> chunk;
    for (uint32_t c = 0; c < grid.chunk_count(); ++c) {
      chunk.resize(ChainReader::ChunkLength(t, c));
      CopyBoxToChunk(grid, whole, c, DTypeSize(t.dtype), pending_, chunk);
      CKPT_RETURN_IF_ERROR(EmitChunk(tensor, chunk));
    }
    pending_ = {};  // the tensor's size is not kept for the chunks after it
    return Status::Ok();
  }

  // Hands a complete chunk of the body to the encoder.
  Status EmitChunk(uint32_t tensor, std::span<const uint8_t> data) {
    return encoder_->Submit(tensor, chunk_index_++, data);
  }

  const StoreContext& ctx_;
  ModelLocks::Guard guard_;
  const PushTarget target_;
  const std::string& model_;  // target_'s
  const uint64_t version_;
  PushOptions push_options_;
  const std::optional<CodecStateRecord>& state_;  // target_'s
  const uint64_t seq_;
  const PushFeed feed_;
  const bool encoded_;    // the body is an encoded push body
  bool started_ = false;  // kChunks: Start was called
  // kChunks: the shard that coded each chunk a rank coded; the one refused, if any.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> coded_by_;
  std::optional<uint32_t> refused_shard_;
  uint64_t reference_version_ = 0;    // the version state_'s reference manifest was pushed as
  SafetensorsStreamParser parser_;    // of a safetensors body
  EncodedBodyParser encoded_parser_;  // of an encoded body
  ChainReader reader_;
  Sha256 sha_;  // of the pushed body (a safetensors body)
  std::string raw_header_;
  PlannedPush planned_;
  CodingPlan plan_;  // of an encoded body: planned_ as its client received it
  ManifestRecord manifest_;
  // Encoded bodies: the chunk expected next, the checkpoint's data bytes, the closing digests.
  uint32_t next_tensor_ = 0;
  uint32_t next_chunk_ = 0;
  uint64_t data_size_ = 0;
  EncodedBodyEnd claimed_;
  std::vector<uint8_t> pending_;
  uint32_t chunk_index_ = 0;      // within its tensor, of the next chunk EmitChunk receives
  uint64_t unchecked_bytes_ = 0;  // received since the last reserve check
  // Declared after what its jobs use: destroyed (joined) before them.
  std::unique_ptr<PushEncoder> encoder_;
  bool committed_ = false;
};

}  // namespace

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

std::unique_ptr<PushSession> NewPushSession(const StoreContext& ctx, ModelLocks::Guard guard,
                                            PushTarget target, std::optional<uint64_t> body_size,
                                            PushOptions options) {
  const PushFeed feed = FeedOf(options);
  return std::make_unique<PushSessionImpl>(ctx, std::move(guard), std::move(target), body_size,
                                           std::move(options), feed);
}

namespace {

// Checks the options, takes the model's write lock and reads where the push goes.
Result<std::unique_ptr<PushSessionImpl>> BeginSession(const StoreContext& ctx, ModelWriter& writer,
                                                      const ModelName& model, uint64_t version,
                                                      std::optional<uint64_t> body_size,
                                                      const PushOptions& options,
                                                      std::chrono::milliseconds wait,
                                                      PushFeed feed) {
  CKPT_RETURN_IF_ERROR(ValidatePushOptions(options));
  CKPT_ASSIGN_OR_RETURN(ModelLocks::Guard guard,
                        writer.LockForPush(model, body_size.value_or(0), wait));
  CKPT_ASSIGN_OR_RETURN(PushTarget target, ReadPushTarget(ctx, writer, model, version));
  return std::make_unique<PushSessionImpl>(ctx, std::move(guard), std::move(target), body_size,
                                           options, feed);
}

}  // namespace

Result<std::unique_ptr<PushSession>> BeginPushSession(const StoreContext& ctx, ModelWriter& writer,
                                                      const ModelName& model, uint64_t version,
                                                      std::optional<uint64_t> body_size,
                                                      const PushOptions& options,
                                                      std::chrono::milliseconds wait) {
  CKPT_ASSIGN_OR_RETURN(auto session, BeginSession(ctx, writer, model, version, body_size, options,
                                                   wait, FeedOf(options)));
  return std::unique_ptr<PushSession>(std::move(session));
}

Result<std::unique_ptr<ChunkedPush>> BeginChunkedPush(const StoreContext& ctx, ModelWriter& writer,
                                                      const ModelName& model, uint64_t version,
                                                      std::optional<uint64_t> body_size,
                                                      const PushOptions& options,
                                                      std::chrono::milliseconds wait) {
  CKPT_ASSIGN_OR_RETURN(auto session, BeginSession(ctx, writer, model, version, body_size, options,
                                                   wait, PushFeed::kChunks));
  return std::unique_ptr<ChunkedPush>(std::move(session));
}

}  // namespace ckpt
