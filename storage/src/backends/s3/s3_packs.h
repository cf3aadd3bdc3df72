// Packs: how the S3 backend keeps many chunk records in one object. Internal to storage/.
//
// A writer gathers the chunk records of one seq into a pack (the records back to back, up to
// S3Options::pack_bytes) and writes it as one object; the commit that refers to the seq carries
// the seq's pack index (which packs hold which records, at which offsets), so any daemon that
// reads the commit finds a record without asking the bucket. Each request is paid for and rate
// limited per prefix, so a version of a thousand small tensors costs a few PUTs, not a thousand.
//
//   chunks/<h>/<model>/<seq>/p<id>   a pack: records, then a footer naming them (PackFooter)
//   control key kPackIndexKey + seq  the seq's pack index, in the model's log and snapshots
//
// <h> and <seq> as for single chunk objects (s3_metadata_log.h); <id> is 16 hex digits, random,
// so a pack's name is written once. A pack is self-describing (its footer lists its records):
// scrub reads packs no commit lists, and the bucket's chunks can be read without the log.
//
// Readers fetch a pack in read blocks (consecutive records up to a size, decided by the index
// alone) with Range GETs, so a restore reads the records it needs in few requests without
// fetching whole packs for a single record.
//
// Written to the bucket: encodings never change; a new encoding bumps kPackFormatVersion.
//
// Thread safety: free functions and value types without shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::s3_layout {

inline constexpr uint8_t kPackFormatVersion = 1;
// Records of a pack read together by one request (at least one record).
inline constexpr uint64_t kReadBlockBytes = 1 << 20;

// One chunk record of a pack.
struct PackMember {
  uint32_t tensor = 0;
  uint32_t chunk = 0;
  uint64_t offset = 0;  // in the pack object
  uint32_t length = 0;
};

// The footer appended to a pack's records.
std::string EncodePackFooter(const std::vector<PackMember>& members);
// The members a whole pack object lists; DataLoss if it is not a pack (checksum, truncation),
// FailedPrecondition when a newer ckptd wrote it.
Result<std::vector<PackMember>> DecodePackFooter(std::string_view object);

// The packs of one seq that a commit refers to, with the members each still holds (a member a
// commit made unreachable leaves the index; a pack without members is removed).
struct PackedSeq {
  struct Pack {
    uint64_t id = 0;
    std::vector<PackMember> members;  // by offset
  };
  std::vector<Pack> packs;
};
std::string EncodePackedSeq(const PackedSeq& packed);
Result<PackedSeq> DecodePackedSeq(std::string_view bytes);

// The control key (model_records.h) of a seq's pack index, and back.
std::string PackIndexKey(uint64_t seq);
std::optional<uint64_t> PackIndexSeq(std::string_view key);

std::string PackKey(std::string_view model, uint64_t seq, uint64_t id);
struct ListedPack {
  std::string name;
  uint64_t seq = 0;
  uint64_t id = 0;
};
// The pack key's address, if `key` is one of `model`'s packs.
std::optional<ListedPack> ParsePackKey(std::string_view model, std::string key);

// The read block of `members` (by offset) holding member `index`: members are grouped greedily,
// in order, into ranges of at most kReadBlockBytes (a larger member is a block of its own).
struct ReadBlock {
  uint64_t offset = 0;
  uint64_t length = 0;
};
std::vector<ReadBlock> PlanReadBlocks(const std::vector<PackMember>& members,
                                      std::vector<uint32_t>* block_of_member);

}  // namespace ckpt::s3_layout
