// The S3 bucket's metadata objects (s3_metadata_log.h).
#include "backends/s3/s3_metadata_log.h"

#include <cstdio>
#include <span>

#include "ckpt/base/hashing.h"
#include "records/keys.h"

namespace ckpt::s3_layout {
namespace {

namespace keys = storage_keys;

constexpr std::string_view kLogMagic = "CKS3LOG\n";
constexpr std::string_view kSnapshotMagic = "CKS3SNP\n";

void PutString(std::string& out, std::string_view s) {
  keys::AppendBigEndian(out, s.size(), 4);
  out.append(s);
}

void PutRecords(std::string& out, const RecordMap& records) {
  keys::AppendBigEndian(out, records.size(), 4);
  for (const auto& [key, value] : records) {
    PutString(out, key);
    PutString(out, value);
  }
}

uint64_t Checksum(std::string_view bytes) {
  return Xxh3Checksum(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

std::string Seal(std::string out) {
  keys::AppendBigEndian(out, Checksum(out), 8);
  return out;
}

// Reads the fields of an encoded object in order; the first failure sticks.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == in_.size(); }
  uint64_t Number(int bytes) {
    if (!Need(static_cast<size_t>(bytes))) return 0;
    const uint64_t v = keys::ReadBigEndian(in_, pos_, bytes);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  std::string String() {
    const uint64_t n = Number(4);
    if (!Need(n)) return {};
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  RecordMap Records() {
    RecordMap records;
    const uint64_t n = Number(4);
    for (uint64_t i = 0; i < n && ok_; ++i) {
      std::string key = String();
      records[std::move(key)] = String();
    }
    return records;
  }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || in_.size() - pos_ < n) ok_ = false;
    return ok_;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Checks magic, checksum and format; the body between them.
Result<std::string_view> Open(std::string_view bytes, std::string_view magic,
                              std::string_view what) {
  if (bytes.size() < magic.size() + 4 + 8 || bytes.substr(0, magic.size()) != magic) {
    return Status::DataLoss("s3: a " + std::string(what) + " object is not one");
  }
  const std::string_view sealed = bytes.substr(0, bytes.size() - 8);
  if (keys::ReadBigEndian(bytes, bytes.size() - 8, 8) != Checksum(sealed)) {
    return Status::DataLoss("s3: a " + std::string(what) + " object fails its checksum");
  }
  const uint64_t format = keys::ReadBigEndian(bytes, magic.size(), 4);
  if (format > kFormatVersion) {
    return Status::FailedPrecondition("s3: a " + std::string(what) +
                                      " object was written by a newer ckptd (format " +
                                      std::to_string(format) + "; this one reads up to " +
                                      std::to_string(kFormatVersion) + "): upgrade this daemon");
  }
  return sealed.substr(magic.size() + 4);
}

std::string Hex16(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace

std::string EncodeLogEntry(const LogEntry& entry) {
  std::string out(kLogMagic);
  keys::AppendBigEndian(out, kFormatVersion, 4);
  keys::AppendBigEndian(out, entry.generation, 8);
  keys::AppendBigEndian(out, entry.epoch, 8);
  PutString(out, entry.token);
  PutString(out, entry.writer_url);
  PutRecords(out, entry.sets);
  keys::AppendBigEndian(out, entry.removals.size(), 4);
  for (const std::string& key : entry.removals) PutString(out, key);
  return Seal(std::move(out));
}

Result<LogEntry> DecodeLogEntry(std::string_view bytes) {
  CKPT_ASSIGN_OR_RETURN(std::string_view body, Open(bytes, kLogMagic, "commit log"));
  Reader in(body);
  LogEntry entry;
  entry.generation = in.Number(8);
  entry.epoch = in.Number(8);
  entry.token = in.String();
  entry.writer_url = in.String();
  entry.sets = in.Records();
  const uint64_t removals = in.Number(4);
  for (uint64_t i = 0; i < removals && in.ok(); ++i) entry.removals.insert(in.String());
  if (!in.ok() || !in.done()) return Status::DataLoss("s3: a commit log object is malformed");
  return entry;
}

std::string EncodeSnapshot(const Snapshot& snapshot) {
  std::string out(kSnapshotMagic);
  keys::AppendBigEndian(out, kFormatVersion, 4);
  keys::AppendBigEndian(out, snapshot.generation, 8);
  keys::AppendBigEndian(out, snapshot.epoch, 8);
  PutRecords(out, snapshot.records);
  return Seal(std::move(out));
}

Result<Snapshot> DecodeSnapshot(std::string_view bytes) {
  CKPT_ASSIGN_OR_RETURN(std::string_view body, Open(bytes, kSnapshotMagic, "snapshot"));
  Reader in(body);
  Snapshot snapshot;
  snapshot.generation = in.Number(8);
  snapshot.epoch = in.Number(8);
  snapshot.records = in.Records();
  if (!in.ok() || !in.done()) return Status::DataLoss("s3: a snapshot object is malformed");
  return snapshot;
}

std::string ModelPrefix(std::string_view model) { return "models/" + std::string(model) + "/"; }
std::string LogPrefix(std::string_view model) { return ModelPrefix(model) + "log/"; }
std::string LogKey(std::string_view model, uint64_t generation) {
  return LogPrefix(model) + Hex16(~generation);
}
std::string SnapshotPrefix(std::string_view model) { return ModelPrefix(model) + "snapshot/"; }
std::string SnapshotKey(std::string_view model, uint64_t generation) {
  return SnapshotPrefix(model) + Hex16(~generation);
}
std::string LeaseKey(std::string_view model) { return ModelPrefix(model) + "lease"; }
std::string KeptPrefix(std::string_view model) { return ModelPrefix(model) + "kept/"; }
std::string KeptKey(std::string_view model, uint64_t generation) {
  return KeptPrefix(model) + Hex16(~generation);
}

std::optional<uint64_t> GenerationOf(std::string_view prefix, std::string_view key) {
  if (!key.starts_with(prefix) || key.size() != prefix.size() + 16) return std::nullopt;
  unsigned long long inverted = 0;
  const std::string digits(key.substr(prefix.size()));
  if (std::sscanf(digits.c_str(), "%16llx", &inverted) != 1) return std::nullopt;
  return ~static_cast<uint64_t>(inverted);
}

namespace {
int HashPrefix(std::string_view model, uint64_t seq) {
  const std::string id = std::string(model) + "/" + Hex16(seq);
  return static_cast<int>(Checksum(id) % kChunkPrefixes);
}
}  // namespace

std::string ChunkListPrefix(std::string_view model, int h) {
  static const char kHex[] = "0123456789abcdef";
  return std::string("chunks/") + kHex[h] + "/" + std::string(model) + "/";
}

std::string ChunkSeqPrefix(std::string_view model, uint64_t seq) {
  return ChunkListPrefix(model, HashPrefix(model, seq)) + Hex16(seq) + "/";
}

std::string ChunkKey(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  return ChunkSeqPrefix(model, seq) + std::to_string(tensor) + "/" + std::to_string(chunk);
}

std::optional<ListedChunk> ParseChunkKey(std::string_view model, std::string key) {
  if (key.size() < 9 || !key.starts_with("chunks/")) return std::nullopt;
  const std::string prefix = std::string(key.substr(0, 9)) + std::string(model) + "/";
  unsigned long long seq = 0;
  unsigned tensor = 0, chunk = 0;
  char tail = 0;
  if (!key.starts_with(prefix) || std::sscanf(key.c_str() + prefix.size(), "%16llx/%u/%u%c", &seq,
                                              &tensor, &chunk, &tail) != 3) {
    return std::nullopt;
  }
  return ListedChunk{std::move(key), seq, tensor, chunk};
}

}  // namespace ckpt::s3_layout
