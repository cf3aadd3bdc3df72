// Pack objects and pack indexes (s3_packs.h).
#include "backends/s3/s3_packs.h"

#include <cstdio>
#include <span>

#include "backends/model_records.h"
#include "backends/s3/s3_metadata_log.h"
#include "ckpt/base/hashing.h"
#include "records/keys.h"

namespace ckpt::s3_layout {
namespace {

namespace keys = storage_keys;

// The footer: members, their count, the format, a checksum of all of it, the magic last (a
// reader finds the footer from the object's end).
constexpr std::string_view kPackMagic = "CKS3PACK";
constexpr size_t kMemberBytes = 4 + 4 + 8 + 4;
constexpr size_t kFooterTail = 4 + 1 + 8 + 8;  // count, format, checksum, magic
constexpr std::string_view kPackIndexPrefix = "\x01pack/";
constexpr uint8_t kPackedSeqFormat = 1;

uint64_t Checksum(std::string_view bytes) {
  return Xxh3Checksum(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

void PutMember(std::string& out, const PackMember& m) {
  keys::AppendBigEndian(out, m.tensor, 4);
  keys::AppendBigEndian(out, m.chunk, 4);
  keys::AppendBigEndian(out, m.offset, 8);
  keys::AppendBigEndian(out, m.length, 4);
}

PackMember ReadMember(std::string_view in, size_t pos) {
  PackMember m;
  m.tensor = static_cast<uint32_t>(keys::ReadBigEndian(in, pos, 4));
  m.chunk = static_cast<uint32_t>(keys::ReadBigEndian(in, pos + 4, 4));
  m.offset = keys::ReadBigEndian(in, pos + 8, 8);
  m.length = static_cast<uint32_t>(keys::ReadBigEndian(in, pos + 16, 4));
  return m;
}

std::string Hex16(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace

std::string EncodePackFooter(const std::vector<PackMember>& members) {
  std::string out;
  for (const PackMember& m : members) PutMember(out, m);
  keys::AppendBigEndian(out, members.size(), 4);
  out.push_back(static_cast<char>(kPackFormatVersion));
  keys::AppendBigEndian(out, Checksum(out), 8);
  out.append(kPackMagic);
  return out;
}

Result<std::vector<PackMember>> DecodePackFooter(std::string_view object) {
  const auto malformed = [] { return Status::DataLoss("s3: a pack object is malformed"); };
  if (object.size() < kFooterTail || !object.ends_with(kPackMagic)) return malformed();
  const size_t tail = object.size() - kFooterTail;
  const uint64_t count = keys::ReadBigEndian(object, tail, 4);
  const uint8_t format = static_cast<uint8_t>(object[tail + 4]);
  if (count > tail / kMemberBytes) return malformed();
  const size_t begin = tail - count * kMemberBytes;
  const std::string_view footer = object.substr(begin, tail + 5 - begin);
  if (Checksum(footer) != keys::ReadBigEndian(object, tail + 5, 8)) return malformed();
  if (format > kPackFormatVersion) {
    return Status::FailedPrecondition("s3: a pack object has format " + std::to_string(format) +
                                      ", newer than this ckptd reads (" +
                                      std::to_string(kPackFormatVersion) + "); upgrade ckptd");
  }
  std::vector<PackMember> members;
  for (uint64_t i = 0; i < count; ++i) {
    PackMember m = ReadMember(object, begin + i * kMemberBytes);
    if (m.offset > begin || m.length > begin - m.offset) return malformed();
    members.push_back(m);
  }
  return members;
}

std::string EncodePackedSeq(const PackedSeq& packed) {
  std::string out(1, static_cast<char>(kPackedSeqFormat));
  keys::AppendBigEndian(out, packed.packs.size(), 4);
  for (const PackedSeq::Pack& pack : packed.packs) {
    keys::AppendBigEndian(out, pack.id, 8);
    keys::AppendBigEndian(out, pack.members.size(), 4);
    for (const PackMember& m : pack.members) PutMember(out, m);
  }
  return out;
}

Result<PackedSeq> DecodePackedSeq(std::string_view bytes) {
  const auto malformed = [] { return Status::DataLoss("s3: a pack index is malformed"); };
  if (bytes.empty()) return malformed();
  if (static_cast<uint8_t>(bytes[0]) > kPackedSeqFormat) {
    return Status::FailedPrecondition("s3: a pack index has format " +
                                      std::to_string(static_cast<uint8_t>(bytes[0])) +
                                      ", newer than this ckptd reads; upgrade ckptd");
  }
  size_t pos = 1;
  const auto need = [&](size_t n) { return bytes.size() - pos >= n; };
  if (!need(4)) return malformed();
  const uint64_t packs = keys::ReadBigEndian(bytes, pos, 4);
  pos += 4;
  PackedSeq packed;
  for (uint64_t p = 0; p < packs; ++p) {
    if (!need(12)) return malformed();
    PackedSeq::Pack pack;
    pack.id = keys::ReadBigEndian(bytes, pos, 8);
    const uint64_t members = keys::ReadBigEndian(bytes, pos + 8, 4);
    pos += 12;
    if (members > (bytes.size() - pos) / kMemberBytes) return malformed();
    for (uint64_t i = 0; i < members; ++i, pos += kMemberBytes) {
      pack.members.push_back(ReadMember(bytes, pos));
    }
    packed.packs.push_back(std::move(pack));
  }
  if (pos != bytes.size()) return malformed();
  return packed;
}

std::string PackIndexKey(uint64_t seq) {
  std::string key(kPackIndexPrefix);
  keys::AppendBigEndian(key, seq, 8);
  return key;
}

std::optional<uint64_t> PackIndexSeq(std::string_view key) {
  if (key.size() != kPackIndexPrefix.size() + 8 || !key.starts_with(kPackIndexPrefix)) {
    return std::nullopt;
  }
  return keys::ReadBigEndian(key, kPackIndexPrefix.size(), 8);
}

std::string PackKey(std::string_view model, uint64_t seq, uint64_t id) {
  return ChunkSeqPrefix(model, seq) + "p" + Hex16(id);
}

std::optional<ListedPack> ParsePackKey(std::string_view model, std::string key) {
  if (key.size() < 9 || !key.starts_with("chunks/")) return std::nullopt;
  const std::string prefix = std::string(key.substr(0, 9)) + std::string(model) + "/";
  unsigned long long seq = 0, id = 0;
  int end = 0;
  if (!key.starts_with(prefix) ||
      std::sscanf(key.c_str() + prefix.size(), "%16llx/p%16llx%n", &seq, &id, &end) != 2 ||
      prefix.size() + static_cast<size_t>(end) != key.size() || key != PackKey(model, seq, id)) {
    return std::nullopt;
  }
  return ListedPack{std::move(key), seq, id};
}

std::vector<ReadBlock> PlanReadBlocks(const std::vector<PackMember>& members,
                                      std::vector<uint32_t>* block_of_member) {
  std::vector<ReadBlock> blocks;
  block_of_member->assign(members.size(), 0);
  for (size_t i = 0; i < members.size(); ++i) {
    const PackMember& m = members[i];
    if (blocks.empty() || m.offset != blocks.back().offset + blocks.back().length ||
        blocks.back().length + m.length > kReadBlockBytes) {
      blocks.push_back({m.offset, 0});
    }
    blocks.back().length += m.length;
    (*block_of_member)[i] = static_cast<uint32_t>(blocks.size() - 1);
  }
  return blocks;
}

}  // namespace ckpt::s3_layout
