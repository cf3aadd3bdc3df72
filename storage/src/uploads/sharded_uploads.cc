// Sharded uploads (sharded_uploads.h).
#include "uploads/sharded_uploads.h"

#include <algorithm>
#include <chrono>

#include "ckpt/base/hashing.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/base/wall_clock.h"

namespace ckpt {
namespace {

// How much of a shard is received between two checks of the free-space reserve.
constexpr uint64_t kReserveCheckBytes = 8ull << 20;

// The answer about an upload whose version is committed already (a shard or a commit sent
// again).
ShardResult AlreadyCommitted(const std::string& model, uint64_t version,
                             const CommittedShards& committed) {
  ShardResult result;
  result.upload.model = model;
  result.upload.version = version;
  result.upload.shard_count = committed.shard_count;
  for (uint32_t i = 0; i < committed.shard_count; ++i) result.upload.received.push_back(i);
  result.upload.received_bytes = committed.info.raw_bytes;
  result.upload.created_at_ms = committed.info.created_at_ms;
  result.upload.committed = true;
  result.version = committed.info;
  result.sent_again = true;
  return result;
}

// " misses N of its M shards (i, j, ...)" naming up to 16 of the shards `received` says are
// missing; "" when none is.
std::string MissingShards(uint32_t shard_count, const std::function<bool(uint32_t)>& received) {
  std::string names;
  uint32_t count = 0;
  for (uint32_t i = 0; i < shard_count; ++i) {
    if (received(i)) continue;
    if (++count <= 16) names += (names.empty() ? "" : ", ") + std::to_string(i);
  }
  if (count == 0) return "";
  return " misses " + std::to_string(count) + " of its " + std::to_string(shard_count) +
         " shards (" + names + (count > 16 ? ", ..." : "") + ")";
}

}  // namespace

// One shard arriving: its body hashed, parsed (its header checked against the upload's other
// shards before the data is read) and written to the spool.
class ShardedUploads::Session final : public ShardSession, private SafetensorsSink {
 public:
  Session(ShardedUploads* owner, std::string model, uint64_t version, uint32_t shard,
          uint32_t shard_count, std::optional<uint64_t> body_size, PushOptions options,
          std::unique_ptr<SpooledShardWriter> writer, std::optional<CommittedShards> committed)
      : owner_(owner),
        model_(std::move(model)),
        version_(version),
        shard_(shard),
        shard_count_(shard_count),
        options_(std::move(options)),
        writer_(std::move(writer)),
        committed_(std::move(committed)),
        parser_(this, body_size) {
    if (options_.body_format == PushBodyFormat::kEncoded) {
      EncodedShardReader::PlanFn plan_of;
      // A shard sent again after its version's commit is only compared with the one committed.
      if (!committed_) {
        plan_of = [this](const ShardHeader& described) -> Result<CodingPlan> {
          CKPT_RETURN_IF_ERROR(CheckHeader(described));
          return owner_->plan_shard_(model_, version_, described, shard_count_,
                                     /*arriving=*/true);
        };
      }
      encoded_.emplace(shard_, owner_->MaxRecordBytes(), std::move(plan_of));
    }
  }

  ~Session() override {
    writer_.reset();  // removes the partial file unless published
    if (!committed_) owner_->SessionEnded(model_, version_);
  }

  Status Write(std::span<const uint8_t> bytes) override {
    if (finished_) return Status::FailedPrecondition("shard already finished");
    if (writer_) {
      unchecked_bytes_ += bytes.size();
      if (unchecked_bytes_ >= kReserveCheckBytes) {
        unchecked_bytes_ = 0;
        CKPT_RETURN_IF_ERROR(owner_->health_->CheckPush(0));
      }
    }
    if (encoded_) {
      CKPT_RETURN_IF_ERROR(encoded_->Feed(bytes));
    } else {
      sha_.Update(bytes);
      CKPT_RETURN_IF_ERROR(parser_.Feed(bytes));
    }
    received_ += bytes.size();
    return writer_ ? writer_->Append(bytes) : Status::Ok();
  }

  Result<ShardResult> Finish() override {
    if (finished_) return Status::FailedPrecondition("shard already finished");
    finished_ = true;
    std::optional<EncodedShardIndex> index;
    if (encoded_) {
      CKPT_RETURN_IF_ERROR(encoded_->Finish());
      header_ = encoded_->header();
      index = std::move(encoded_->index());
    } else {
      CKPT_RETURN_IF_ERROR(parser_.Finish());
    }
    // An encoded shard is known by the digest of the safetensors shard its rank coded, which
    // its end frame names: the same shard has the same digest however it was sent.
    const std::string digest = index ? index->pushed_sha256 : sha_.FinishHex();
    if (committed_) return SentAgain(*committed_, digest);
    CKPT_RETURN_IF_ERROR(writer_->Seal(digest));
    {
      std::unique_lock lock(owner_->mu_);
      auto it = owner_->uploads_.find(Key(model_, version_));
      // A shard sent again while another one commits the version (ranks retrying after a
      // failure): its answer is the commit's outcome.
      while (it != owner_->uploads_.end() && it->second.committing) {
        owner_->commit_ended_.wait(lock);
        it = owner_->uploads_.find(Key(model_, version_));
      }
      if (it == owner_->uploads_.end()) {
        lock.unlock();
        CKPT_ASSIGN_OR_RETURN(auto committed, owner_->committed_(model_, version_));
        if (committed) return SentAgain(*committed, digest);
        return Status::NotFound("the upload of " + UploadName(model_, version_) +
                                " was aborted or expired while shard " + std::to_string(shard_) +
                                " arrived");
      }
      Upload& upload = it->second;
      CKPT_RETURN_IF_ERROR(owner_->CheckAgainstUpload(upload, *header_));
      Status published = writer_->Publish();
      if (published.code() == StatusCode::kAborted) {
        // Refused while the writer commits the upload; if the same shard is stored already (a
        // rank retrying), its answer is the upload's, not a refusal to retry until the commit
        // ends. Nothing of `upload` changed: the pool is asked without the lock.
        lock.unlock();
        if (AlreadyStored(digest)) return owner_->ShardStored(model_, version_, shard_, options_);
        return published;
      }
      CKPT_RETURN_IF_ERROR(published);
      upload.shards[shard_] =
          StoredShard{SpooledShard{shard_, received_, digest, NowMs(), writer_->attempt()},
                      std::move(*header_), std::move(index)};
      upload.reload_ticket = ++owner_->reload_tickets_;
      upload.last_active_ms = NowMs();
    }
    return owner_->ShardStored(model_, version_, shard_, options_);
  }

 private:
  Status OnHeader(const SafetensorsHeader& header, std::string_view) override {
    CKPT_ASSIGN_OR_RETURN(ShardHeader described, DescribeShard(shard_, header));
    if (!committed_) CKPT_RETURN_IF_ERROR(CheckHeader(described));
    header_ = std::move(described);
    return Status::Ok();
  }
  // Whether the spool lists this shard with `digest` (a shared spool's shard sent again).
  bool AlreadyStored(const std::string& digest) {
    auto listed = owner_->spool_->Shards(model_, version_);
    if (!listed.ok()) return false;
    for (const SpooledShard& s : *listed) {
      if (s.shard == shard_ && s.sha256_hex == digest) return true;
    }
    return false;
  }
  // Checks a shard's header against the shards of its upload already stored.
  Status CheckHeader(const ShardHeader& described) {
    std::lock_guard lock(owner_->mu_);
    auto it = owner_->uploads_.find(Key(model_, version_));
    if (it == owner_->uploads_.end()) return Status::Ok();
    return owner_->CheckAgainstUpload(it->second, described);
  }
  // The answer to a shard sent again after its version was committed.
  Result<ShardResult> SentAgain(const CommittedShards& committed, const std::string& digest) {
    if (committed.shard_count != shard_count_ || committed.shard_sha256.size() <= shard_ ||
        committed.shard_sha256[shard_] != digest) {
      return Status::FailedPrecondition(UploadName(model_, version_) + " is committed; shard " +
                                        std::to_string(shard_) +
                                        " differs from the one it was committed with");
    }
    return AlreadyCommitted(model_, version_, committed);
  }

  Status OnTensorData(size_t, std::span<const uint8_t>) override { return Status::Ok(); }
  Status OnTensorEnd(size_t) override { return Status::Ok(); }

  ShardedUploads* const owner_;
  const std::string model_;
  const uint64_t version_;
  const uint32_t shard_;
  const uint32_t shard_count_;  // as the request declares it
  const PushOptions options_;
  std::unique_ptr<SpooledShardWriter> writer_;  // null when the version is committed
  const std::optional<CommittedShards> committed_;
  SafetensorsStreamParser parser_;             // of a safetensors shard
  Sha256 sha_;                                 // of a safetensors shard
  std::optional<EncodedShardReader> encoded_;  // of an encoded shard
  std::optional<ShardHeader> header_;
  uint64_t received_ = 0;
  uint64_t unchecked_bytes_ = 0;
  bool finished_ = false;
};

ShardedUploads::ShardedUploads(const StoreOptions* options, StoreHealth* health,
                               BeginPushFn begin_push, BeginChunkedFn begin_chunked,
                               PlanShardFn plan_shard, CommittedFn committed,
                               WriteOwnerFn write_owner)
    : options_(options),
      health_(health),
      begin_push_(std::move(begin_push)),
      begin_chunked_(std::move(begin_chunked)),
      plan_shard_(std::move(plan_shard)),
      committed_(std::move(committed)),
      write_owner_(std::move(write_owner)) {}

uint64_t ShardedUploads::MaxRecordBytes() const { return 2 * options_->chunk_bytes + (1 << 20); }

Result<std::optional<ShardedUploads::StoredShard>> ShardedUploads::LoadStoredShard(
    const UploadRecord& record, SpooledShard spooled) {
  CKPT_ASSIGN_OR_RETURN(auto file, spool_->OpenShard(record.model, record.version, spooled));
  CKPT_ASSIGN_OR_RETURN(const bool encoded, IsEncodedShard(*file));
  std::optional<EncodedShardIndex> index;
  ShardHeader header;
  if (encoded) {
    // Its records were checked when it arrived (under the chunk size of that time); one that
    // no longer reads is dropped, for its rank to send again.
    auto indexed = IndexStoredShard(spooled.shard, *file, file->body_bytes());
    if (!indexed.ok() && indexed.status().code() != StatusCode::kDataLoss) {
      return indexed.status();
    }
    if (!indexed.ok()) {
      CKPT_RETURN_IF_ERROR(spool_->RemoveShard(record.model, record.version, spooled.shard));
      return std::optional<StoredShard>();
    }
    index = std::move(indexed).value();
    CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader parsed,
                          ParseRawSafetensorsHeader(index->raw_header));
    CKPT_ASSIGN_OR_RETURN(header, DescribeShard(spooled.shard, parsed));
  } else {
    CKPT_ASSIGN_OR_RETURN(header, ReadShardHeader(spooled.shard, *file));
  }
  return std::optional<StoredShard>(
      StoredShard{std::move(spooled), std::move(header), std::move(index)});
}

Status ShardedUploads::Open(std::unique_ptr<UploadSpool> spool,
                            const VersionExistsFn& version_exists) {
  spool_ = std::move(spool);
  CKPT_RETURN_IF_ERROR(spool_->Open());
  // A shared spool's uploads are read when they are asked about (Reload).
  if (spool_->shared()) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(std::vector<UploadRecord> records, spool_->List());
  for (UploadRecord& record : records) {
    CKPT_ASSIGN_OR_RETURN(const bool committed, version_exists(record.model, record.version));
    if (committed) {
      CKPT_RETURN_IF_ERROR(spool_->Remove(record.model, record.version));
      continue;
    }
    Upload upload;
    upload.last_active_ms = record.created_at_ms;
    CKPT_ASSIGN_OR_RETURN(auto shards, spool_->Shards(record.model, record.version));
    for (SpooledShard& s : shards) {
      if (s.shard >= record.shard_count) continue;
      const int64_t stored_at_ms = s.stored_at_ms;
      CKPT_ASSIGN_OR_RETURN(std::optional<StoredShard> stored,
                            LoadStoredShard(record, std::move(s)));
      if (!stored) continue;
      upload.last_active_ms = std::max(upload.last_active_ms, stored_at_ms);
      const uint32_t shard_index = stored->spooled.shard;
      upload.shards.emplace(shard_index, std::move(*stored));
    }
    upload.record = record;
    std::lock_guard lock(mu_);
    uploads_.emplace(Key(record.model, record.version), std::move(upload));
  }
  return Status::Ok();
}

Status ShardedUploads::Reload(const std::string& model, uint64_t version) {
  if (!spool_->shared()) return Status::Ok();
  const Key key(model, version);
  uint64_t ticket;
  {
    std::lock_guard lock(mu_);
    ticket = ++reload_tickets_;
  }
  CKPT_ASSIGN_OR_RETURN(std::optional<UploadRecord> record, spool_->Find(model, version));
  std::vector<SpooledShard> listed;
  if (record) {
    CKPT_ASSIGN_OR_RETURN(listed, spool_->Shards(model, version));
  }
  std::lock_guard lock(mu_);
  auto it = uploads_.find(key);
  // An upload being committed here, or a newer listing already in, stays as it is.
  if (it != uploads_.end() && (it->second.committing || it->second.reload_ticket > ticket)) {
    return Status::Ok();
  }
  if (!record) {
    // Committed, aborted or expired through another daemon.
    if (it != uploads_.end() && it->second.sessions == 0) {
      uploads_.erase(it);
      erased_ticket_ = ++reload_tickets_;
    }
    return Status::Ok();
  }
  if (it == uploads_.end()) {
    if (ticket < erased_ticket_) return Status::Ok();  // listed before an upload was erased
    it = uploads_.emplace(key, Upload()).first;
  }
  Upload& upload = it->second;
  std::map<uint32_t, StoredShard> shards;
  int64_t last_active_ms = record->created_at_ms;
  for (SpooledShard& s : listed) {
    if (s.shard >= record->shard_count) continue;
    last_active_ms = std::max(last_active_ms, s.stored_at_ms);
    auto known = upload.shards.find(s.shard);
    if (known != upload.shards.end() && known->second.spooled.SameAttempt(s)) {
      shards.emplace(s.shard, std::move(known->second));
      continue;
    }
    StoredShard listed_only;
    listed_only.described = false;
    listed_only.header.shard = s.shard;
    listed_only.spooled = std::move(s);
    shards.emplace(listed_only.spooled.shard, std::move(listed_only));
  }
  upload.record = *record;
  upload.shards = std::move(shards);
  upload.last_active_ms = std::max(upload.last_active_ms, last_active_ms);
  upload.reload_ticket = ticket;
  return Status::Ok();
}

Status ShardedUploads::ReloadAll() {
  if (!spool_->shared()) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(std::vector<UploadRecord> records, spool_->List());
  std::vector<Key> keys;
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, upload] : uploads_) keys.push_back(key);
  }
  for (const UploadRecord& r : records) keys.emplace_back(r.model, r.version);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  for (const Key& key : keys) (void)Reload(key.first, key.second);
  return Status::Ok();
}

Result<std::map<uint32_t, ShardedUploads::StoredShard>> ShardedUploads::ShardsToCommit(
    const UploadRecord& record) {
  CKPT_ASSIGN_OR_RETURN(std::vector<SpooledShard> listed,
                        spool_->Shards(record.model, record.version));
  std::map<uint32_t, StoredShard> shards;
  std::vector<SpooledShard> to_read;
  {
    std::lock_guard lock(mu_);
    auto it = uploads_.find(Key(record.model, record.version));
    for (SpooledShard& s : listed) {
      if (s.shard >= record.shard_count) continue;
      if (it != uploads_.end()) {
        auto known = it->second.shards.find(s.shard);
        if (known != it->second.shards.end() && known->second.described &&
            known->second.spooled.SameAttempt(s)) {
          shards.emplace(s.shard, known->second);
          continue;
        }
      }
      to_read.push_back(std::move(s));
    }
  }
  for (SpooledShard& s : to_read) {
    const uint32_t index = s.shard;
    CKPT_ASSIGN_OR_RETURN(std::optional<StoredShard> stored, LoadStoredShard(record, std::move(s)));
    if (stored) shards.emplace(index, std::move(*stored));
  }
  return shards;
}

Result<std::unique_ptr<ShardSession>> ShardedUploads::Begin(
    const std::string& model, uint64_t version, uint32_t shard, uint32_t shard_count,
    std::optional<uint64_t> body_size, PushOptions options,
    std::optional<CommittedShards> committed) {
  if (committed) {
    if (committed->shard_count != shard_count) {
      return Status::FailedPrecondition(UploadName(model, version) + " is committed (as " +
                                        std::to_string(committed->shard_count) + " shard" +
                                        (committed->shard_count == 1 ? "" : "s") + ", not " +
                                        std::to_string(shard_count) + ")");
    }
    return std::unique_ptr<ShardSession>(
        std::make_unique<Session>(this, model, version, shard, shard_count, body_size,
                                  std::move(options), nullptr, std::move(committed)));
  }
  // A shared spool's upload may have been created (or removed) by another daemon: its record
  // is the spool's.
  std::optional<UploadRecord> shared_record;
  if (spool_->shared()) {
    CKPT_ASSIGN_OR_RETURN(shared_record,
                          spool_->Create(UploadRecord{model, version, shard_count, NowMs()}));
  }
  {
    std::lock_guard lock(mu_);
    auto it = uploads_.find(Key(model, version));
    if (it != uploads_.end() && shared_record) {
      // Another upload of the same version (the one this daemon saw was aborted or expired
      // through another daemon): its shards are not this one's.
      if (it->second.record.created_at_ms != shared_record->created_at_ms) {
        it->second.shards.clear();
      }
      it->second.record = *shared_record;
    }
    if (it == uploads_.end()) {
      UploadRecord record{model, version, shard_count, NowMs()};
      if (shared_record) {
        record = *shared_record;
      } else {
        CKPT_ASSIGN_OR_RETURN(record, spool_->Create(record));
      }
      Upload upload;
      upload.record = record;
      upload.last_active_ms = record.created_at_ms;
      it = uploads_.emplace(Key(model, version), std::move(upload)).first;
    }
    Upload& upload = it->second;
    if (upload.record.shard_count != shard_count) {
      return Status::InvalidArgument("the upload of " + UploadName(model, version) + " has " +
                                     std::to_string(upload.record.shard_count) + " shards, not " +
                                     std::to_string(shard_count));
    }
    if (upload.committing) {
      return Status::Aborted("the upload of " + UploadName(model, version) + " is being committed");
    }
    ++upload.sessions;
    upload.last_active_ms = NowMs();
  }
  auto writer = spool_->NewShardWriter(model, version, shard);
  if (!writer.ok()) {
    SessionEnded(model, version);
    return writer.status();
  }
  return std::unique_ptr<ShardSession>(
      std::make_unique<Session>(this, model, version, shard, shard_count, body_size,
                                std::move(options), std::move(writer).value(), std::nullopt));
}

void ShardedUploads::SessionEnded(const std::string& model, uint64_t version) {
  std::lock_guard lock(mu_);
  auto it = uploads_.find(Key(model, version));
  if (it != uploads_.end() && it->second.sessions > 0) --it->second.sessions;
}

ShardUploadInfo ShardedUploads::InfoOf(const Upload& upload) const {
  ShardUploadInfo info;
  info.model = upload.record.model;
  info.version = upload.record.version;
  info.shard_count = upload.record.shard_count;
  for (const auto& [index, shard] : upload.shards) {
    info.received.push_back(index);
    info.received_bytes += shard.spooled.body_bytes;
  }
  info.created_at_ms = upload.record.created_at_ms;
  info.expires_at_ms =
      upload.last_active_ms +
      std::chrono::duration_cast<std::chrono::milliseconds>(options_->upload_expiry).count();
  return info;
}

Status ShardedUploads::CheckAgainstUpload(const Upload& upload, const ShardHeader& header) const {
  std::vector<const ShardHeader*> others;
  for (const auto& [index, shard] : upload.shards) {
    // Shards other daemons stored are checked at the commit.
    if (index != header.shard && shard.described) others.push_back(&shard.header);
  }
  return CheckShardAgainst(header, others);
}

Result<ShardUploadInfo> ShardedUploads::Get(const std::string& model, uint64_t version) {
  CKPT_RETURN_IF_ERROR(Reload(model, version));
  std::lock_guard lock(mu_);
  auto it = uploads_.find(Key(model, version));
  if (it == uploads_.end()) {
    return Status::NotFound("no upload of " + UploadName(model, version) + " is in progress");
  }
  return InfoOf(it->second);
}

std::vector<ShardUploadInfo> ShardedUploads::List() {
  // A shared spool that cannot be read now is listed as this daemon last saw it.
  (void)ReloadAll();
  std::lock_guard lock(mu_);
  std::vector<ShardUploadInfo> out;
  for (const auto& [key, upload] : uploads_) out.push_back(InfoOf(upload));
  return out;
}

Result<ShardResult> ShardedUploads::ShardStored(const std::string& model, uint64_t version,
                                                uint32_t shard, const PushOptions& options) {
  PushOptions commit_options = options;
  commit_options.body_format = PushBodyFormat::kSafetensors;  // the shard's, not the version's
  bool own_shard_dropped = false;
  auto result = CommitUpload(model, version, commit_options, shard, &own_shard_dropped);
  // A shard the commit dropped is not stored: its error says so.
  if (!result.ok() && result.status().code() != StatusCode::kNotFound && !own_shard_dropped) {
    return result.status().WithContext("the shard is stored, but " + UploadName(model, version) +
                                       " cannot be committed");
  }
  return result;
}

Result<ShardResult> ShardedUploads::Commit(const std::string& model, uint64_t version,
                                           const PushOptions& options) {
  {
    // A commit asked for while one is running (ranks that each saw their upload complete) is
    // answered by its outcome.
    std::unique_lock lock(mu_);
    auto running = [&] {
      auto it = uploads_.find(Key(model, version));
      return it != uploads_.end() && it->second.committing;
    };
    while (running()) commit_ended_.wait(lock);
  }
  auto result = CommitUpload(model, version, options, /*stored_shard=*/std::nullopt,
                             /*own_shard_dropped=*/nullptr);
  if (result.ok() || result.status().code() != StatusCode::kNotFound) return result;
  CKPT_ASSIGN_OR_RETURN(auto committed, committed_(model, version));
  if (!committed || committed->shard_count == 0) return result;
  return AlreadyCommitted(model, version, *committed);
}

Result<ShardResult> ShardedUploads::CommitUpload(const std::string& model, uint64_t version,
                                                 const PushOptions& options,
                                                 std::optional<uint32_t> stored_shard,
                                                 bool* own_shard_dropped) {
  const bool by_last_shard = stored_shard.has_value();
  const bool shared = spool_->shared();
  CKPT_RETURN_IF_ERROR(Reload(model, version));
  // In a cluster only the model's writer commits; the others say where the commit goes.
  std::optional<std::string> owner;
  if (shared) {
    CKPT_ASSIGN_OR_RETURN(owner, write_owner_(model, /*claim=*/true));
    if (!owner) {
      // This daemon holds the lease, so its view of the model is current: an upload whose
      // version is committed is a leftover of a commit whose removal failed.
      CKPT_ASSIGN_OR_RETURN(auto committed, committed_(model, version));
      if (committed) {
        CKPT_RETURN_IF_ERROR(spool_->Remove(model, version));
        std::lock_guard lock(mu_);
        auto it = uploads_.find(Key(model, version));
        if (it != uploads_.end() && !it->second.committing && it->second.sessions == 0) {
          uploads_.erase(it);
          erased_ticket_ = ++reload_tickets_;
        }
        return Status::NotFound("no upload of " + UploadName(model, version) +
                                " is in progress (the version is committed)");
      }
    }
  }
  // Claims the upload for this commit (`committing`), or answers why not.
  std::vector<StoredShard> stored;
  UploadRecord record;
  bool stale_mark = false;  // the writer sees a shared upload incomplete: no commit of it runs
  std::string missing;      // " misses ... shards (...)" when shards are missing
  {
    std::lock_guard lock(mu_);
    auto it = uploads_.find(Key(model, version));
    if (it == uploads_.end()) {
      return Status::NotFound("no upload of " + UploadName(model, version) + " is in progress");
    }
    Upload& upload = it->second;
    // A shard stored while another commits it, or before the last one: nothing more to do.
    if (by_last_shard && (upload.committing || upload.shards.size() < upload.record.shard_count)) {
      return ShardResult{InfoOf(upload), std::nullopt};
    }
    if (upload.committing) {
      return Status::Aborted("the upload of " + UploadName(model, version) + " is being committed");
    }
    missing = MissingShards(upload.record.shard_count,
                            [&](uint32_t i) { return upload.shards.count(i) > 0; });
    if (!missing.empty()) {
      stale_mark = shared && !owner;
      if (!stale_mark) {
        return Status::FailedPrecondition("the upload of " + UploadName(model, version) + missing);
      }
    } else if (owner) {
      ShardResult complete{InfoOf(upload), std::nullopt};
      complete.upload.commit_through = owner->empty() ? "another daemon" : *owner;
      return complete;
    }
    upload.committing = true;
    record = upload.record;
    for (const auto& [index, shard] : upload.shards) stored.push_back(shard);
  }
  if (stale_mark) {
    // Asked of the writer (it holds the lease), which commits nothing of it now: a mark left by
    // a commit that never ended (its daemon died) would refuse the missing shards until the
    // upload expires. Cleared under this daemon's claim, so that no commit of it starts here
    // meanwhile.
    spool_->EndCommit(model, version, /*token=*/"");
    std::vector<std::function<void()>> after_commit;
    {
      std::lock_guard lock(mu_);
      if (auto it = uploads_.find(Key(model, version)); it != uploads_.end()) {
        it->second.committing = false;
      }
      commit_ended_.notify_all();
      if (auto waiting = after_commit_.find(model); waiting != after_commit_.end()) {
        after_commit = std::move(waiting->second);
        after_commit_.erase(waiting);
      }
    }
    for (auto& on_end : after_commit) on_end();
    return Status::FailedPrecondition("the upload of " + UploadName(model, version) + missing +
                                      "; send them again");
  }
  // With a shared spool: no shard is published while the commit reads them, and the shards are
  // those the spool lists under that mark.
  std::string commit_token;
  Status marked = Status::Ok();
  if (shared) {
    auto token = spool_->BeginCommit(model, version);
    marked = token.status();
    if (token.ok()) commit_token = std::move(token).value();
  }
  std::vector<uint32_t> stale;  // encoded shards coded by a plan that is no longer the store's
  auto assembled = [&]() -> Result<VersionInfo> {
    CKPT_RETURN_IF_ERROR(marked);
    if (shared) {
      CKPT_ASSIGN_OR_RETURN(auto listed, ShardsToCommit(record));
      if (listed.size() < record.shard_count) {
        return Status::FailedPrecondition(
            "the upload of " + UploadName(model, version) +
            MissingShards(record.shard_count, [&](uint32_t i) { return listed.count(i) > 0; }) +
            "; send them again");
      }
      stored.clear();
      for (auto& [index, shard] : listed) stored.push_back(std::move(shard));
    }
    std::vector<const ShardHeader*> header_ptrs;
    std::vector<const StoredShard*> shards;
    std::vector<std::string> digests;
    bool any_encoded = false;
    for (const StoredShard& s : stored) {
      header_ptrs.push_back(&s.header);
      shards.push_back(&s);
      digests.push_back(s.spooled.sha256_hex);
      any_encoded |= s.encoded.has_value();
    }
    CKPT_ASSIGN_OR_RETURN(AssemblyPlan plan, PlanAssembly(header_ptrs, digests));
    if (any_encoded) return CommitChunked(model, version, options, shards, plan, &stale);
    std::vector<std::unique_ptr<SpooledShardFile>> files;
    std::vector<const SpooledShardFile*> file_ptrs;
    for (const StoredShard& s : stored) {
      CKPT_ASSIGN_OR_RETURN(auto file, spool_->OpenShard(model, version, s.spooled));
      file_ptrs.push_back(file.get());
      files.push_back(std::move(file));
    }
    CKPT_ASSIGN_OR_RETURN(auto session, begin_push_(model, version, plan.body_bytes, options));
    CKPT_RETURN_IF_ERROR(WriteAssembled(
        plan, file_ptrs, [&](std::span<const uint8_t> bytes) { return session->Write(bytes); }));
    return session->Commit();
  }();
  std::vector<std::function<void()>> after_commit;
  Result<ShardResult> result = [&]() -> Result<ShardResult> {
    std::lock_guard lock(mu_);
    commit_ended_.notify_all();  // the waiters look once this lock is released
    if (auto waiting = after_commit_.find(model); waiting != after_commit_.end()) {
      after_commit = std::move(waiting->second);
      after_commit_.erase(waiting);
    }
    auto it = uploads_.find(Key(model, version));
    if (!assembled.ok()) {
      // They can never commit: their ranks send them again, by a new plan. Removed while the
      // mark still refuses the shards sent again.
      for (uint32_t shard : stale) {
        (void)spool_->RemoveShard(model, version, shard);
        if (it != uploads_.end()) {
          it->second.shards.erase(shard);
          it->second.reload_ticket = ++reload_tickets_;
        }
      }
      if (shared && marked.ok()) spool_->EndCommit(model, version, commit_token);
      if (it != uploads_.end()) it->second.committing = false;
      // A rank whose own shard stays is told that the version waits for the dropped ones: it
      // has nothing to send again. (A commit asked for by no shard hears their error.)
      if (stored_shard && !stale.empty()) {
        if (std::find(stale.begin(), stale.end(), *stored_shard) == stale.end()) {
          return Status::ShardsDropped(assembled.status().message());
        }
        *own_shard_dropped = true;
      }
      return assembled.status();
    }
    ShardResult committed;
    if (it != uploads_.end()) {
      committed.upload = InfoOf(it->second);
      uploads_.erase(it);
      erased_ticket_ = ++reload_tickets_;
    }
    committed.upload.committed = true;
    committed.version = std::move(assembled).value();
    // The version is committed: a spool directory left by a failed removal goes at the next
    // open.
    (void)spool_->Remove(model, version);
    return committed;
  }();
  for (auto& on_end : after_commit) on_end();
  return result;
}

Result<VersionInfo> ShardedUploads::CommitChunked(const std::string& model, uint64_t version,
                                                  const PushOptions& options,
                                                  const std::vector<const StoredShard*>& shards,
                                                  const AssemblyPlan& plan,
                                                  std::vector<uint32_t>* stale) {
  // A shard coded by a plan the store no longer makes (a version committed, or the policy
  // changed, since it arrived) cannot be stored: it is dropped from the upload.
  std::string stale_list;
  for (const StoredShard* s : shards) {
    if (!s->encoded) continue;
    auto now = plan_shard_(model, version, s->header, static_cast<uint32_t>(shards.size()),
                           /*arriving=*/false);
    if (!now.ok()) {
      stale->clear();  // nothing is dropped for an error that is not theirs
      return now.status();
    }
    const bool same = now->Digest() == s->encoded->plan_digest &&
                      (now->base ? now->base->reference : 0) == s->encoded->reference;
    if (same) continue;
    stale->push_back(s->header.shard);
    stale_list += (stale_list.empty() ? "" : ", ") + std::to_string(s->header.shard);
  }
  if (!stale->empty()) {
    return Status::StalePlan(
        "shards " + stale_list + " of " + UploadName(model, version) +
        " were coded by a plan the model no longer codes by (a version was committed or the "
        "policy changed since they arrived); they are dropped from the upload: their ranks ask "
        "for a new plan and send them again");
  }
  std::vector<std::unique_ptr<SpooledShardFile>> files;
  std::vector<ShardSource> sources;
  std::vector<ChunkedPush::CodedShard> coded;
  for (const StoredShard* s : shards) {
    CKPT_ASSIGN_OR_RETURN(auto file, spool_->OpenShard(model, version, s->spooled));
    sources.push_back({file.get(), s->encoded ? &*s->encoded : nullptr});
    files.push_back(std::move(file));
    if (s->encoded) {
      coded.push_back({&s->header, s->encoded->plan_digest, s->encoded->reference});
    }
  }
  CKPT_ASSIGN_OR_RETURN(auto push, begin_chunked_(model, version, plan.body_bytes, options));
  Result<CodingPlan> started =
      push->Start(plan.raw_header, coded, static_cast<uint32_t>(shards.size()));
  if (started.status().subcode() == StatusSubcode::kStalePlan) {
    // Every coded shard follows the plan its own slices make (checked above), yet not the
    // version's: the slices of a tensor cut it along different dimensions, and a shard whose
    // slice cuts one dimension only was planned in tiles the version does not use. Asking for
    // a plan again would give the same one.
    return Status::InvalidArgument(
        UploadName(model, version) +
        ": a shard was coded in tiles the version does not use (the slices of a tensor cut it "
        "along different dimensions): send the coded shards plain");
  }
  CKPT_ASSIGN_OR_RETURN(const CodingPlan version_plan, std::move(started));
  Status written = WriteAssembledChunks(plan, version_plan, sources, *push);
  Result<VersionInfo> committed = written.ok() ? push->Commit() : Result<VersionInfo>(written);
  if (!committed.ok()) {
    // A shard whose record does not restore to what its rank reconstructed never commits.
    if (auto refused = push->RefusedShard()) stale->push_back(*refused);
  }
  return committed;
}

bool ShardedUploads::CallAfterCommit(const std::string& model, std::function<void()> on_end) {
  std::lock_guard lock(mu_);
  for (auto it = uploads_.lower_bound(Key(model, 0));
       it != uploads_.end() && it->first.first == model; ++it) {
    if (!it->second.committing) continue;
    after_commit_[model].push_back(std::move(on_end));
    return true;
  }
  return false;
}

Status ShardedUploads::Abort(const std::string& model, uint64_t version) {
  CKPT_RETURN_IF_ERROR(Reload(model, version));
  std::lock_guard lock(mu_);
  auto it = uploads_.find(Key(model, version));
  if (it == uploads_.end()) {
    return Status::NotFound("no upload of " + UploadName(model, version) + " is in progress");
  }
  if (it->second.committing) {
    return Status::Aborted("the upload of " + UploadName(model, version) + " is being committed");
  }
  CKPT_RETURN_IF_ERROR(spool_->Remove(model, version));
  uploads_.erase(it);
  erased_ticket_ = ++reload_tickets_;
  return Status::Ok();
}

Result<std::vector<ShardUploadInfo>> ShardedUploads::Expire(int64_t now_ms) {
  // A shared upload expires by its shards stored through any daemon, and only on the model's
  // writer: it alone knows whether a commit of it runs.
  CKPT_RETURN_IF_ERROR(ReloadAll());
  std::vector<Key> candidates;
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, upload] : uploads_) {
      if (!upload.committing && upload.sessions == 0 && InfoOf(upload).expires_at_ms <= now_ms) {
        candidates.push_back(key);
      }
    }
  }
  std::vector<ShardUploadInfo> expired;
  for (const Key& key : candidates) {
    if (spool_->shared()) {
      auto owner = write_owner_(key.first, /*claim=*/false);
      if (!owner.ok() || *owner) continue;
    }
    std::lock_guard lock(mu_);
    auto it = uploads_.find(key);
    if (it == uploads_.end() || it->second.committing || it->second.sessions > 0) continue;
    ShardUploadInfo info = InfoOf(it->second);
    if (info.expires_at_ms > now_ms) continue;
    CKPT_RETURN_IF_ERROR(spool_->Remove(key.first, key.second));
    expired.push_back(std::move(info));
    uploads_.erase(it);
    erased_ticket_ = ++reload_tickets_;
  }
  return expired;
}

std::optional<uint64_t> ShardedUploads::UploadBetween(const std::string& model,
                                                      std::optional<uint64_t> latest,
                                                      uint64_t version) {
  std::lock_guard lock(mu_);
  auto it =
      latest ? uploads_.upper_bound(Key(model, *latest)) : uploads_.lower_bound(Key(model, 0));
  if (it == uploads_.end() || it->first.first != model || it->first.second >= version) {
    return std::nullopt;
  }
  return it->first.second;
}

Status ShardedUploads::RemoveModel(const std::string& model) {
  CKPT_RETURN_IF_ERROR(ReloadAll());
  std::lock_guard lock(mu_);
  for (auto it = uploads_.lower_bound(Key(model, 0));
       it != uploads_.end() && it->first.first == model;) {
    if (it->second.committing) {
      ++it;
      continue;
    }
    CKPT_RETURN_IF_ERROR(spool_->Remove(model, it->first.second));
    it = uploads_.erase(it);
    erased_ticket_ = ++reload_tickets_;
  }
  return Status::Ok();
}

}  // namespace ckpt
