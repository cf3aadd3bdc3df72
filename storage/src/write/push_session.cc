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
#include "read/catalog.h"
#include "read/chain_reader.h"
#include "records/keys.h"
#include "write/push_encoder.h"

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

class PushSessionImpl final : public PushSession, private SafetensorsSink {
 public:
  PushSessionImpl(const StoreContext& ctx, ModelLocks::Guard guard, PushTarget target,
                  std::optional<uint64_t> body_size, PushOptions options)
      : ctx_(ctx),
        guard_(std::move(guard)),
        model_(std::move(target.model)),
        version_(target.version),
        policy_(std::move(target.policy)),
        retention_deletes_(target.retention_deletes),
        retention_(std::move(target.retention)),
        push_options_(std::move(options)),
        model_record_(std::move(target.model_record)),
        state_(std::move(target.state)),
        seq_(target.seq),
        parser_(this, body_size),
        reader_(ctx.db, ctx.manifests, ctx.backend, nullptr, model_, ctx.cache),
        encoder_(std::make_unique<PushEncoder>(ctx, model_, seq_, &reader_, &manifest_)) {}

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
    // BeginPush checked the body's announced size against the reserve; bodies of unknown size
    // and concurrent pushes are caught here, as the volume reaches it.
    unchecked_bytes_ += bytes.size();
    if (unchecked_bytes_ >= kReserveCheckBytes) {
      unchecked_bytes_ = 0;
      CKPT_RETURN_IF_ERROR(ctx_.health->CheckPush(0));
    }
    sha_.Update(bytes);
    return parser_.Feed(bytes);
  }

  Result<VersionInfo> Commit() override {
    if (committed_) return Status::FailedPrecondition("push already committed");
    CKPT_RETURN_IF_ERROR(parser_.Finish());
    CKPT_ASSIGN_OR_RETURN(const uint64_t stored_bytes, encoder_->Finish());

    VersionRecord vr;
    vr.seq = seq_;
    vr.floor_seq = manifest_.floor_seq;
    vr.created_at_ms = NowMs();
    vr.raw_bytes = parser_.consumed();
    vr.tensor_count = static_cast<uint32_t>(manifest_.tensors.size());
    vr.sha256_hex = sha_.FinishHex();
    vr.restored_sha256_hex =
        encoder_->restored_is_pushed() ? vr.sha256_hex : encoder_->RestoredSha256Hex();
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
    ModelRecord model = model_record_.value_or(ModelRecord{});
    if (!model_record_) model.created_at_ms = vr.created_at_ms;
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
    const ManifestRecord* reference = nullptr;
    std::unordered_map<std::string_view, uint32_t> reference_index;
    if (state_) {
      CKPT_ASSIGN_OR_RETURN(reference, reader_.Manifest(state_->reference_seq));
      reference_version_ = reference->version;
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
    // A checkpoint that the reference cache does not keep has its latest, and the next push's
    // reference after a restart, decoded from storage: "fast_latest": "auto" then puts it on
    // the lattice that the rearrangement stores newest-first.
    uint64_t checkpoint_bytes = raw_header.size();  // with its length prefix
    for (const auto& t : header.tensors) checkpoint_bytes += t.byte_size();
    const bool larger_than_cache = !ctx_.cache->KeepsVersionOf(checkpoint_bytes);
    for (const auto& t : header.tensors) {
      TensorCoding coding = policy_.ForTensor(t.name, t.dtype, t.shape, larger_than_cache);
      // Lattice versions with element history cost more to re-encode exactly (their states go
      // along): a model whose retention deletes versions is coded without it.
      if (coding.lossy && coding.lossy_options.reclaimable && retention_deletes_) {
        coding.lossy_options.history = false;
      }
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
      encoder_->AddTensor(coding, mt.chunk_count);
      mt.kind = FrameKind::kKeyframe;
      mt.keyframe_seq = seq_;
      if (auto it = reference_index.find(t.name); it != reference_index.end()) {
        const ManifestTensor& rt = reference->tensors[it->second];
        // Lossy chains also restart once their deltas outweigh their keyframe by the policy's
        // budget: that bounds what a restore reads and what a chain keeps alive.
        const bool chain_outweighs_keyframe =
            coding.lossy && policy_.KeyframeBudgetExceeded(rt.keyframe_bytes, rt.chain_bytes);
        // A tensor that retention keeps for the newest K versions only restarts its chain at
        // least every K versions: once dropped, its data is freed a chain later.
        const uint64_t chain_limit = std::min<uint64_t>(
            keyframe_every,
            retention_.ChainLimitFor(t.name).value_or(std::numeric_limits<uint64_t>::max()));
        if (!coding.standalone && rt.dtype == mt.dtype && rt.shape == mt.shape &&
            rt.chunk_bytes == mt.chunk_bytes && mt.byte_size > 0 &&
            rt.chain_length + 1 < chain_limit && !chain_outweighs_keyframe) {
          mt.LinkTo(state_->reference_seq, it->second, rt);
        }
      }
      manifest_.floor_seq = std::min(manifest_.floor_seq, mt.keyframe_seq);
      manifest_.tensors.push_back(std::move(mt));
    }
    return Status::Ok();
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

  // Hands a complete chunk of the body to the encoder.
  Status EmitChunk(uint32_t tensor, std::span<const uint8_t> data) {
    return encoder_->Submit(tensor, chunk_index_++, data);
  }

  const StoreContext& ctx_;
  ModelLocks::Guard guard_;
  const std::string model_;
  const uint64_t version_;
  const CodecPolicy policy_;
  const bool retention_deletes_;  // the model's retention policy has rules (RetentionOf)
  const RetentionPolicy retention_;
  PushOptions push_options_;
  const std::optional<ModelRecord> model_record_;
  const std::optional<CodecStateRecord> state_;
  const uint64_t seq_;
  uint64_t reference_version_ = 0;  // the version state_'s reference manifest was pushed as
  SafetensorsStreamParser parser_;
  ChainReader reader_;
  Sha256 sha_;  // of the pushed body
  std::string raw_header_;
  ManifestRecord manifest_;
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
  return std::make_unique<PushSessionImpl>(ctx, std::move(guard), std::move(target), body_size,
                                           std::move(options));
}

Result<std::unique_ptr<PushSession>> BeginPushSession(const StoreContext& ctx, ModelWriter& writer,
                                                      const ModelName& model, uint64_t version,
                                                      std::optional<uint64_t> body_size,
                                                      const PushOptions& options,
                                                      std::chrono::milliseconds wait) {
  CKPT_RETURN_IF_ERROR(ValidatePushOptions(options));
  CKPT_ASSIGN_OR_RETURN(ModelLocks::Guard guard,
                        writer.LockForPush(model, body_size.value_or(0), wait));
  PushTarget target;
  target.model = std::string(model);
  target.version = version;
  const std::string& name = target.model;
  rocksdb::ReadOptions ro;
  CKPT_ASSIGN_OR_RETURN(target.model_record,
                        ctx.GetRecord<ModelRecord>(ro, ctx.models, name, "model record"));
  const std::optional<ModelRecord>& record = target.model_record;
  if (record && record->has_versions && version <= record->latest_version) {
    return Status::FailedPrecondition(
        "version " + std::to_string(version) + " must be greater than the latest version " +
        std::to_string(record->latest_version) + " of model '" + name + "'");
  }
  if (!record) CKPT_RETURN_IF_ERROR(writer.CheckModelLimit());
  CKPT_ASSIGN_OR_RETURN(target.state,
                        ctx.GetRecord<CodecStateRecord>(ro, ctx.codec_state, name, "codec state"));
  const CodecPolicy& default_policy = ctx.options->default_policy;
  target.policy = default_policy;
  if (record && !record->policy_json.empty()) {
    CKPT_ASSIGN_OR_RETURN(target.policy,
                          CodecPolicy::FromJson(record->policy_json, default_policy));
  }
  CKPT_ASSIGN_OR_RETURN(const RetentionPolicy retention,
                        record ? writer.RetentionOf(*record)
                               : Result<RetentionPolicy>(ctx.options->default_retention));
  target.retention_deletes = !retention.KeepsEverything();
  target.retention = retention;
  target.seq = std::max(target.state ? target.state->next_seq : 1, ctx.backend->SeqFloor(name));
  return NewPushSession(ctx, std::move(guard), std::move(target), body_size, options);
}

}  // namespace ckpt
