// The upload spool in the cluster's pool (rados_upload_spool.h).
#include "backends/rados/rados_upload_spool.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "backends/rados/rados_layout.h"
#include "backends/rados/rados_status.h"
#include "ckpt/base/wall_clock.h"

namespace ckpt {
namespace {

using nlohmann::json;
using rados_layout::OmapValues;
using rados_layout::U64;

constexpr char kIndexObject[] = "uploads";
constexpr char kRecordKey[] = "record";
constexpr char kCommittingKey[] = "committing";
constexpr char kShardKeyPrefix[] = "shard.";
constexpr char kAttemptKeyPrefix[] = "attempt.";
// Below the OSDs' largest object (osd_max_object_size, by default).
constexpr uint64_t kPieceBytes = 64ull << 20;
// Below the OSDs' largest write (osd_max_write_size, by default).
constexpr size_t kWriteBytes = 8 << 20;

std::string UploadObject(const std::string& model, uint64_t version) {
  return "upload/" + model + "/" + std::to_string(version);
}

std::string PieceObject(const std::string& model, uint64_t version, const std::string& attempt,
                        uint64_t piece) {
  return UploadObject(model, version) + "/" + attempt + "/" + std::to_string(piece);
}

std::string IndexKey(const std::string& model, uint64_t version) {
  std::string key = model;
  key.push_back('\0');
  return key + std::to_string(version);
}

// Fixed width, so that the omap lists shards in index order.
std::string ShardKey(uint32_t shard) {
  char key[32];
  std::snprintf(key, sizeof key, "%s%010u", kShardKeyPrefix, shard);
  return key;
}

std::string NewAttemptId() {
  std::random_device random;
  char id[32];
  std::snprintf(id, sizeof id, "%08x%08x", random(), random());
  return id;
}

librados::bufferlist Bytes(const std::string& s) {
  librados::bufferlist bl;
  bl.append(s);
  return bl;
}

Status Gone(const std::string& model, uint64_t version) {
  return Status::NotFound("the upload of " + UploadName(model, version) +
                          " was committed, aborted or expired");
}

// The omap values of `oid` whose keys start with `prefix` (all of them: paged).
Result<OmapValues> ReadOmap(librados::IoCtx& io, const std::string& oid,
                            const std::string& prefix) {
  OmapValues all;
  std::string after;
  for (bool more = true; more;) {
    OmapValues page;
    int prval = 0;
    librados::ObjectReadOperation op;
    op.omap_get_vals2(after, prefix, rados_layout::kOmapPage, &page, &more, &prval);
    const int r = io.operate(oid, &op, nullptr);
    if (r == -ENOENT) return Status::NotFound("no object " + oid);
    CKPT_RETURN_IF_ERROR(FromRados(r, "reading " + oid));
    if (page.empty()) break;
    after = page.rbegin()->first;
    all.merge(page);
  }
  return all;
}

Result<UploadRecord> ParseRecord(const std::string& text) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || doc.value("format", 0) != UploadRecord::kFormatVersion) {
    return Status::DataLoss("rados: an upload's record is not one this daemon reads");
  }
  UploadRecord r;
  try {
    r.model = doc.value("model", "");
    r.version = doc.value("version", uint64_t{0});
    r.shard_count = doc.value("shard_count", 0u);
    r.created_at_ms = doc.value("created_at_ms", int64_t{0});
  } catch (const json::exception&) {
    return Status::DataLoss("rados: an upload's record is not one this daemon reads");
  }
  return r;
}

// Removes pieces [0, pieces) of an attempt, the last first (so that an interrupted removal
// leaves a prefix, which the attempt's count still covers).
Status RemovePieces(librados::IoCtx& io, const std::string& model, uint64_t version,
                    const std::string& attempt, uint64_t pieces) {
  for (uint64_t p = pieces; p-- > 0;) {
    const int r = io.remove(PieceObject(model, version, attempt, p));
    if (r != -ENOENT) {
      CKPT_RETURN_IF_ERROR(FromRados(r, "removing the upload of " + UploadName(model, version)));
    }
  }
  return Status::Ok();
}

// Reads an attempt's pieces. Thread-compatible.
class RadosShardFile final : public SpooledShardFile {
 public:
  RadosShardFile(librados::IoCtx& io, std::string model, uint64_t version, SpooledShard stored)
      : model_(std::move(model)), version_(version), stored_(std::move(stored)) {
    io_.dup(io);
  }
  uint64_t body_bytes() const override { return stored_.body_bytes; }

  Status ReadAt(uint64_t offset, std::span<uint8_t> out) const override {
    if (offset + out.size() > stored_.body_bytes) {
      return Status::Internal("shard read past its body");
    }
    size_t done = 0;
    while (done < out.size()) {
      const uint64_t at = offset + done;
      const uint64_t piece = at / kPieceBytes;
      const uint64_t in_piece = at % kPieceBytes;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(
          out.size() - done, std::min<uint64_t>(kPieceBytes - in_piece, kWriteBytes)));
      librados::bufferlist data;
      const std::string oid = PieceObject(model_, version_, stored_.attempt, piece);
      const int r = io_.read(oid, data, n, in_piece);
      if (r == -ENOENT) {
        return Status::DataLoss("stored shard " + std::to_string(stored_.shard) + " of " +
                                UploadName(model_, version_) + " is missing a piece");
      }
      CKPT_RETURN_IF_ERROR(FromRados(r, "reading shard " + std::to_string(stored_.shard)));
      if (data.length() != n) {
        return Status::DataLoss("stored shard " + std::to_string(stored_.shard) + " of " +
                                UploadName(model_, version_) + " ends early");
      }
      data.begin().copy(static_cast<unsigned>(n), reinterpret_cast<char*>(out.data() + done));
      done += n;
    }
    return Status::Ok();
  }

 private:
  mutable librados::IoCtx io_;
  const std::string model_;
  const uint64_t version_;
  const SpooledShard stored_;
};

// Writes an attempt's pieces; Publish names it in the upload's omap. Thread-compatible.
class RadosShardWriter final : public SpooledShardWriter {
 public:
  RadosShardWriter(librados::IoCtx& io, std::string model, uint64_t version, uint32_t shard,
                   std::string attempt)
      : model_(std::move(model)), version_(version), shard_(shard), attempt_(std::move(attempt)) {
    io_.dup(io);
    buffer_.reserve(kWriteBytes);
  }

  ~RadosShardWriter() override {
    if (published_) return;
    // Best effort: what stays is removed with the upload (the attempt is registered).
    if (!RemovePieces(io_, model_, version_, attempt_, pieces_).ok()) return;
    librados::ObjectWriteOperation op;
    op.omap_rm_keys({kAttemptKeyPrefix + attempt_});
    io_.operate(UploadObject(model_, version_), &op);
  }

  Status Append(std::span<const uint8_t> bytes) override {
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), kWriteBytes - buffer_.size());
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
      bytes = bytes.subspan(n);
      if (buffer_.size() == kWriteBytes) CKPT_RETURN_IF_ERROR(Flush());
    }
    return Status::Ok();
  }

  Status Seal(const std::string& sha256_hex) override {
    CKPT_RETURN_IF_ERROR(Flush());
    sha256_hex_ = sha256_hex;
    return Status::Ok();
  }

  Status Publish() override {
    const json value = {{"attempt", attempt_},
                        {"body_bytes", written_},
                        {"sha256", sha256_hex_},
                        {"stored_at_ms", NowMs()}};
    librados::ObjectWriteOperation op;
    int guard = 0;
    op.assert_exists();
    op.omap_cmp({{kCommittingKey, {U64(0), LIBRADOS_CMPXATTR_OP_EQ}}}, &guard);
    op.omap_set({{ShardKey(shard_), Bytes(value.dump())}});
    const int r = io_.operate(UploadObject(model_, version_), &op);
    if (r == -ECANCELED) {
      return Status::Aborted("the upload of " + UploadName(model_, version_) +
                             " is being committed by the model's writer: shard " +
                             std::to_string(shard_) + " is not stored; send it again");
    }
    if (r == -ENOENT) return Gone(model_, version_);
    CKPT_RETURN_IF_ERROR(FromRados(r, "storing shard " + std::to_string(shard_)));
    published_ = true;
    return Status::Ok();
  }

  std::string attempt() const override { return attempt_; }

 private:
  Status Flush() {
    size_t done = 0;
    while (done < buffer_.size()) {
      const uint64_t piece = written_ / kPieceBytes;
      const uint64_t in_piece = written_ % kPieceBytes;
      if (in_piece == 0) {
        // The attempt names its pieces before each is written, so a removal finds them all.
        librados::ObjectWriteOperation count;
        count.assert_exists();
        count.omap_set({{kAttemptKeyPrefix + attempt_, U64(piece + 1)}});
        const int r = io_.operate(UploadObject(model_, version_), &count);
        if (r == -ENOENT) return Gone(model_, version_);
        CKPT_RETURN_IF_ERROR(FromRados(r, "storing shard " + std::to_string(shard_)));
        pieces_ = piece + 1;
      }
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(buffer_.size() - done, kPieceBytes - in_piece));
      librados::bufferlist data;
      data.append(reinterpret_cast<const char*>(buffer_.data() + done), static_cast<unsigned>(n));
      const int r = io_.write(PieceObject(model_, version_, attempt_, piece), data, n, in_piece);
      CKPT_RETURN_IF_ERROR(FromRados(r, "storing shard " + std::to_string(shard_)));
      written_ += n;
      done += n;
    }
    buffer_.clear();
    return Status::Ok();
  }

  librados::IoCtx io_;
  const std::string model_;
  const uint64_t version_;
  const uint32_t shard_;
  const std::string attempt_;
  std::vector<uint8_t> buffer_;
  uint64_t written_ = 0;
  uint64_t pieces_ = 0;  // pieces registered (each before its first byte is written)
  std::string sha256_hex_;
  bool published_ = false;
};

// Thread safety: safe for concurrent use (each call is its own RADOS operations).
class RadosUploadSpool final : public UploadSpool {
 public:
  explicit RadosUploadSpool(librados::IoCtx& io) { io_.dup(io); }

  bool shared() const override { return true; }

  // Attempts in progress may be other daemons': nothing is removed at open.
  Status Open() override { return Status::Ok(); }

  Result<std::vector<UploadRecord>> List() override {
    auto index = ReadOmap(io_, kIndexObject, "");
    if (!index.ok() && index.status().code() == StatusCode::kNotFound) {
      return std::vector<UploadRecord>();
    }
    CKPT_RETURN_IF_ERROR(index.status());
    std::vector<UploadRecord> uploads;
    for (const auto& [key, value] : *index) {
      const size_t nul = key.find('\0');
      if (nul == std::string::npos) continue;
      const std::string model = key.substr(0, nul);
      const uint64_t version = std::strtoull(key.c_str() + nul + 1, nullptr, 10);
      // An index key without its upload: the upload is being created (or its creator died
      // between the two steps, which leaves a key and nothing else).
      CKPT_ASSIGN_OR_RETURN(std::optional<UploadRecord> record, Find(model, version));
      if (record) uploads.push_back(std::move(*record));
    }
    return uploads;
  }

  Result<std::optional<UploadRecord>> Find(const std::string& model, uint64_t version) override {
    OmapValues values;
    int prval = 0;
    librados::ObjectReadOperation op;
    op.omap_get_vals_by_keys({kRecordKey}, &values, &prval);
    const int r = io_.operate(UploadObject(model, version), &op, nullptr);
    if (r == -ENOENT) return std::optional<UploadRecord>();
    CKPT_RETURN_IF_ERROR(FromRados(r, "reading the upload of " + UploadName(model, version)));
    auto it = values.find(kRecordKey);
    if (it == values.end()) return std::optional<UploadRecord>();
    CKPT_ASSIGN_OR_RETURN(UploadRecord record, ParseRecord(it->second.to_str()));
    return std::optional<UploadRecord>(std::move(record));
  }

  Result<UploadRecord> Create(const UploadRecord& record) override {
    const std::string what = "creating the upload of " + UploadName(record.model, record.version);
    // The index first: an upload is always listed (a key whose upload is missing is skipped).
    librados::ObjectWriteOperation index;
    index.omap_set({{IndexKey(record.model, record.version), librados::bufferlist()}});
    CKPT_RETURN_IF_ERROR(FromRados(io_.operate(kIndexObject, &index), what));
    const json doc = {{"format", UploadRecord::kFormatVersion},
                      {"model", record.model},
                      {"version", record.version},
                      {"shard_count", record.shard_count},
                      {"created_at_ms", record.created_at_ms}};
    librados::ObjectWriteOperation op;
    op.create(/*exclusive=*/true);
    op.omap_set({{kRecordKey, Bytes(doc.dump())}, {kCommittingKey, U64(0)}});
    const int r = io_.operate(UploadObject(record.model, record.version), &op);
    if (r != -EEXIST) {
      CKPT_RETURN_IF_ERROR(FromRados(r, what));
      return record;
    }
    // Another daemon created it: its record is the upload's.
    CKPT_ASSIGN_OR_RETURN(std::optional<UploadRecord> stored, Find(record.model, record.version));
    if (!stored) {
      return Status::Aborted("the upload of " + UploadName(record.model, record.version) +
                             " was being removed; send the shard again");
    }
    return *stored;
  }

  Result<std::vector<SpooledShard>> Shards(const std::string& model, uint64_t version) override {
    auto values = ReadOmap(io_, UploadObject(model, version), kShardKeyPrefix);
    if (!values.ok() && values.status().code() == StatusCode::kNotFound) {
      return std::vector<SpooledShard>();
    }
    CKPT_RETURN_IF_ERROR(values.status());
    std::vector<SpooledShard> shards;
    for (const auto& [key, value] : *values) {
      const json doc = json::parse(value.to_str(), nullptr, /*allow_exceptions=*/false);
      if (!doc.is_object()) {
        return Status::DataLoss("rados: a stored shard of " + UploadName(model, version) +
                                " is not described as this daemon reads");
      }
      SpooledShard s;
      s.shard = static_cast<uint32_t>(std::strtoul(key.c_str() + 6, nullptr, 10));
      try {
        s.attempt = doc.value("attempt", "");
        s.body_bytes = doc.value("body_bytes", uint64_t{0});
        s.sha256_hex = doc.value("sha256", "");
        s.stored_at_ms = doc.value("stored_at_ms", int64_t{0});
      } catch (const json::exception&) {
        return Status::DataLoss("rados: a stored shard of " + UploadName(model, version) +
                                " is not described as this daemon reads");
      }
      shards.push_back(std::move(s));
    }
    return shards;
  }

  Result<std::unique_ptr<SpooledShardWriter>> NewShardWriter(const std::string& model,
                                                             uint64_t version,
                                                             uint32_t shard) override {
    const std::string attempt = NewAttemptId();
    librados::ObjectWriteOperation op;
    op.assert_exists();
    op.omap_set({{kAttemptKeyPrefix + attempt, librados::bufferlist()}});
    const int r = io_.operate(UploadObject(model, version), &op);
    if (r == -ENOENT) return Gone(model, version);
    CKPT_RETURN_IF_ERROR(FromRados(
        r, "storing shard " + std::to_string(shard) + " of " + UploadName(model, version)));
    return std::unique_ptr<SpooledShardWriter>(
        std::make_unique<RadosShardWriter>(io_, model, version, shard, attempt));
  }

  Result<std::unique_ptr<SpooledShardFile>> OpenShard(const std::string& model, uint64_t version,
                                                      const SpooledShard& stored) override {
    if (stored.attempt.empty()) {
      return Status::Internal("a stored shard of " + UploadName(model, version) +
                              " names no attempt");
    }
    return std::unique_ptr<SpooledShardFile>(
        std::make_unique<RadosShardFile>(io_, model, version, stored));
  }

  Status Remove(const std::string& model, uint64_t version) override {
    const std::string oid = UploadObject(model, version);
    auto attempts = ReadOmap(io_, oid, kAttemptKeyPrefix);
    if (attempts.ok()) {
      for (const auto& [key, value] : *attempts) {
        const std::string attempt = key.substr(sizeof kAttemptKeyPrefix - 1);
        // The count of pieces begun; an empty value: none.
        const std::string count = value.to_str();
        uint64_t pieces = 0;
        if (count.size() == 8) {
          for (unsigned char c : count) pieces = (pieces << 8) | c;  // u64 BE
        }
        CKPT_RETURN_IF_ERROR(RemovePieces(io_, model, version, attempt, pieces));
      }
    } else if (attempts.status().code() != StatusCode::kNotFound) {
      return attempts.status();
    }
    const int r = io_.remove(oid);
    if (r != -ENOENT) {
      CKPT_RETURN_IF_ERROR(FromRados(r, "removing the upload of " + UploadName(model, version)));
    }
    librados::ObjectWriteOperation index;
    index.omap_rm_keys({IndexKey(model, version)});
    const int i = io_.operate(kIndexObject, &index);
    return i == -ENOENT ? Status::Ok()
                        : FromRados(i, "removing the upload of " + UploadName(model, version));
  }

  Status RemoveShard(const std::string& model, uint64_t version, uint32_t shard) override {
    librados::ObjectWriteOperation op;
    op.omap_rm_keys({ShardKey(shard)});
    const int r = io_.operate(UploadObject(model, version), &op);
    return r == -ENOENT ? Status::Ok()
                        : FromRados(r, "removing shard " + std::to_string(shard) + " of " +
                                           UploadName(model, version));
  }

  Result<std::string> BeginCommit(const std::string& model, uint64_t version) override {
    const std::string token = "commit " + NewAttemptId() + " " + std::to_string(NowMs());
    librados::ObjectWriteOperation op;
    op.assert_exists();
    op.omap_set({{kCommittingKey, Bytes(token)}});
    const int r = io_.operate(UploadObject(model, version), &op);
    if (r == -ENOENT) return Gone(model, version);
    CKPT_RETURN_IF_ERROR(FromRados(r, "committing the upload of " + UploadName(model, version)));
    return token;
  }

  void EndCommit(const std::string& model, uint64_t version, const std::string& token) override {
    librados::ObjectWriteOperation op;
    int guard = 0;
    op.assert_exists();
    if (!token.empty())
      op.omap_cmp({{kCommittingKey, {Bytes(token), LIBRADOS_CMPXATTR_OP_EQ}}}, &guard);
    op.omap_set({{kCommittingKey, U64(0)}});
    io_.operate(UploadObject(model, version), &op);  // -ECANCELED: another commit holds it
  }

 private:
  librados::IoCtx io_;
};

}  // namespace

std::unique_ptr<UploadSpool> NewRadosUploadSpool(librados::IoCtx& io) {
  return std::make_unique<RadosUploadSpool>(io);
}

}  // namespace ckpt
