// Packs of chunk records on S3 (backends/s3/s3_packs.h, s3_model_packs.h): the encodings are
// forever (golden bytes), damage is detected, and what a commit adds to and removes from the
// index — records written again, tensors dropped, whole models — leaves exactly the packs
// something still needs.
#include "backends/s3/s3_packs.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>

#include "backends/s3/s3_metadata_log.h"
#include "backends/s3/s3_model_packs.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::Hex;

using namespace s3_layout;

TEST(S3PacksTest, FootersAndIndexesKeepTheirBytesAndRoundTrip) {
  const std::vector<PackMember> members = {{1, 0, 0, 5}, {1, 1, 5, 3}};
  const std::string footer = EncodePackFooter(members);
  // Golden: a change of these bytes breaks every bucket already written.
  EXPECT_EQ(Hex(footer),
            "0000000100000000000000000000000000000005000000010000000100000000000000050000"
            "00030000000201e5769ac9ae778230434b53335041434b")
      << Hex(footer);
  auto decoded = DecodePackFooter("abcdefgh" + footer);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->size(), 2u);
  EXPECT_EQ((*decoded)[1].offset, 5u);
  EXPECT_EQ((*decoded)[1].length, 3u);

  PackedSeq packed;
  packed.packs.push_back({0x0102030405060708, members});
  const std::string index = EncodePackedSeq(packed);
  EXPECT_EQ(Hex(index),
            "0100000001010203040506070800000002000000010000000000000000000000000000000500"
            "00000100000001000000000000000500000003")
      << Hex(index);
  auto back = DecodePackedSeq(index);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->packs.size(), 1u);
  EXPECT_EQ(back->packs[0].id, 0x0102030405060708u);
  EXPECT_EQ(back->packs[0].members.size(), 2u);
}

TEST(S3PacksTest, DamageIsDataLossAndANewerFormatIsRefused) {
  const std::string pack = "abcdefgh" + EncodePackFooter({{0, 0, 0, 8}});
  for (size_t i = 8; i < pack.size(); ++i) {
    std::string damaged = pack;
    damaged[i] ^= 0x10;
    EXPECT_FALSE(DecodePackFooter(damaged).ok()) << "byte " << i;
  }
  EXPECT_EQ(DecodePackFooter(pack.substr(0, pack.size() - 1)).status().code(),
            StatusCode::kDataLoss);
  // A member beyond the records is refused even with a valid checksum.
  EXPECT_EQ(DecodePackFooter("abc" + EncodePackFooter({{0, 0, 0, 8}})).status().code(),
            StatusCode::kDataLoss);
  std::string index = EncodePackedSeq(PackedSeq{{{7, {{0, 0, 0, 8}}}}});
  EXPECT_EQ(DecodePackedSeq(index.substr(0, index.size() - 1)).status().code(),
            StatusCode::kDataLoss);
  index[0] = 9;
  auto refused = DecodePackedSeq(index);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("upgrade ckptd"), std::string::npos);
}

TEST(S3PacksTest, KeysParseBackAndIndexKeysAreControlKeys) {
  const std::string key = PackKey("model.a", 0x10000000005, 0xabcdef);
  auto parsed = ParsePackKey("model.a", key);
  ASSERT_TRUE(parsed.has_value()) << key;
  EXPECT_EQ(parsed->seq, 0x10000000005u);
  EXPECT_EQ(parsed->id, 0xabcdefu);
  EXPECT_FALSE(ParsePackKey("model", key).has_value());
  EXPECT_FALSE(ParsePackKey("model.a", key + "0").has_value());
  EXPECT_FALSE(ParsePackKey("model.a", ChunkKey("model.a", 5, 1, 2)).has_value());
  EXPECT_FALSE(ParseChunkKey("model.a", key).has_value()) << "a pack is no single record";
  EXPECT_EQ(PackIndexKey(9)[0], kControlKeyPrefix);
  EXPECT_EQ(PackIndexSeq(PackIndexKey(9)), 9u);
  EXPECT_EQ(PackIndexSeq("f12345678"), std::nullopt);
}

TEST(S3PacksTest, ReadBlocksGroupNeighboursUpToTheirSize) {
  const uint32_t u = kReadBlockBytes / 4;
  std::vector<PackMember> members = {
      {0, 0, 0, u}, {0, 1, u, u}, {0, 2, 2 * u, u}, {0, 3, 3 * u, 2 * u}, {0, 4, 5 * u, 6 * u}};
  std::vector<uint32_t> block_of;
  auto blocks = PlanReadBlocks(members, &block_of);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].offset, 0u);
  EXPECT_EQ(blocks[0].length, 3u * u);
  EXPECT_EQ(blocks[1].length, 2u * u);
  EXPECT_EQ(blocks[2].length, 6u * u) << "a large record is a block of its own";
  EXPECT_EQ(block_of, (std::vector<uint32_t>{0, 0, 0, 1, 2}));
  // A gap (a record the index dropped) ends a block.
  members.erase(members.begin() + 1);
  blocks = PlanReadBlocks(members, &block_of);
  EXPECT_EQ(blocks[0].length, u);
  EXPECT_EQ(blocks[1].offset, 2u * u);
}

constexpr auto kGrace = std::chrono::minutes(5);
// Records a commit retired are found no longer (RecordsACommitRetiredAreFoundForTheGrace tests
// the grace).
constexpr auto kNoGrace = std::chrono::minutes(0);

ChunkSet SetOf(uint64_t seq, std::vector<uint32_t> counts, bool some = false) {
  ChunkSet set;
  set.seq = seq;
  set.chunk_counts = std::move(counts);
  set.some_tensors = some;
  return set;
}

// A writer's packs: filled up to the size, closed when the seq changes, committed into the index.
TEST(ModelPacksTest, RecordsArePackedAndFoundWhereverTheyAre) {
  ModelPacks packs("m", 10, kGrace);
  EXPECT_TRUE(packs.Add(5, 0, 0, "aaaa").empty());
  auto open = packs.Find(5, 0, 0);
  ASSERT_TRUE(open.has_value());
  EXPECT_TRUE(open->open);
  EXPECT_EQ(open->bytes, "aaaa");
  auto full = packs.Add(5, 0, 1, "bbbbbbbb");  // would overflow: the first pack is written
  ASSERT_EQ(full.size(), 1u);
  auto members = DecodePackFooter(full[0].bytes);
  ASSERT_TRUE(members.ok());
  EXPECT_EQ(members->size(), 1u);
  EXPECT_EQ(full[0].bytes.substr(0, 4), "aaaa");
  full = packs.Add(6, 0, 0, "c");  // another seq: the open pack is written
  ASSERT_EQ(full.size(), 1u);
  auto written = packs.Find(5, 0, 1);
  ASSERT_TRUE(written.has_value());
  EXPECT_TRUE(written->uncommitted);
  EXPECT_EQ(written->length, 8u);

  std::vector<StoreBackend::ChunkAddress> unpacked;
  auto change = packs.Plan({SetOf(5, {2})}, {}, false, &unpacked);
  EXPECT_EQ(change.attached, (std::vector<uint64_t>{5}));
  EXPECT_EQ(change.sets.count(PackIndexKey(5)), 1u);
  EXPECT_TRUE(change.dead.empty());
  packs.Apply(change);
  auto committed = packs.Find(5, 0, 1);
  ASSERT_TRUE(committed.has_value());
  EXPECT_FALSE(committed->uncommitted);
  EXPECT_EQ(committed->block.length, 8u);
  EXPECT_EQ(packs.Committed(6).size(), 2u);
  EXPECT_EQ(packs.Committed(5).size(), 0u);

  // Another daemon rebuilds the same index from the log's records.
  ModelPacks reader("m", 10, kGrace);
  ASSERT_TRUE(reader.Replace(packs.Records()).ok());
  auto found = reader.Find(5, 0, 0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->key, packs.Find(5, 0, 0)->key);
  EXPECT_EQ(found->length, 4u);
  EXPECT_FALSE(reader.Find(6, 0, 0).has_value()) << "seq 6 is not committed";
}

TEST(ModelPacksTest, ARecordWrittenAgainSupersedesTheEarlierAndEmptyPacksDie) {
  ModelPacks packs("m", 4, kGrace);
  ASSERT_EQ(packs.Add(1, 0, 0, "old!").size(), 1u);  // pack A: (0,0)
  ASSERT_EQ(packs.Add(1, 0, 0, "new!").size(), 1u);  // pack B: (0,0) again
  ASSERT_EQ(packs.Add(1, 1, 0, "tens").size(), 1u);  // pack C
  std::vector<StoreBackend::ChunkAddress> unpacked;
  auto change = packs.Plan({SetOf(1, {1, 1})}, {}, false, &unpacked);
  ASSERT_EQ(change.dead.size(), 1u) << "pack A holds only a superseded record";
  packs.Apply(change);
  auto at = packs.Find(1, 0, 0);
  ASSERT_TRUE(at.has_value());
  EXPECT_NE(at->key, change.dead[0]);
  EXPECT_EQ(packs.Committed(2).size(), 2u);
}

TEST(ModelPacksTest, UnreachableTensorsLeaveTheIndexAndPacksGoWithTheirLastRecord) {
  ModelPacks packs("m", 1 << 20, kNoGrace);
  packs.Add(3, 0, 0, "a");
  packs.Add(3, 1, 0, "b");
  ASSERT_TRUE(packs.Close().has_value());
  packs.Add(3, 2, 0, "c");
  ASSERT_TRUE(packs.Close().has_value());
  std::vector<StoreBackend::ChunkAddress> unpacked;
  packs.Apply(packs.Plan({SetOf(3, {1, 1, 1})}, {}, false, &unpacked));
  ASSERT_EQ(packs.Committed(4).size(), 2u);

  // Tensor 1 goes: its pack stays for tensor 0; tensor 2's pack goes.
  auto change = packs.Plan({}, {SetOf(3, {0, 1, 1}, true)}, false, &unpacked);
  EXPECT_TRUE(unpacked.empty());
  ASSERT_EQ(change.dead.size(), 1u);
  packs.Apply(change);
  EXPECT_TRUE(packs.Find(3, 0, 0).has_value());
  EXPECT_FALSE(packs.Find(3, 1, 0).has_value());
  EXPECT_FALSE(packs.Find(3, 2, 0).has_value());

  // A seq no pack holds (single record objects) is named for removal.
  change = packs.Plan({}, {SetOf(9, {2})}, false, &unpacked);
  EXPECT_EQ(unpacked.size(), 2u);
  EXPECT_TRUE(change.seqs.empty());

  // The whole seq: its index record goes.
  unpacked.clear();
  change = packs.Plan({}, {SetOf(3, {1, 1, 1})}, false, &unpacked);
  EXPECT_EQ(change.removals.count(PackIndexKey(3)), 1u);
  EXPECT_EQ(change.dead.size(), 1u);
  packs.Apply(change);
  EXPECT_TRUE(packs.Committed(10).empty());
}

TEST(ModelPacksTest, ADeletedModelTakesEveryPackAndAnAbortedPushItsOwn) {
  ModelPacks packs("m", 1 << 20, kNoGrace);
  packs.Add(1, 0, 0, "a");
  packs.Close();
  std::vector<StoreBackend::ChunkAddress> unpacked;
  packs.Apply(packs.Plan({SetOf(1, {1})}, {}, false, &unpacked));
  packs.Add(2, 0, 0, "b");
  packs.Close();
  packs.Add(3, 0, 0, "c");
  packs.Close();
  EXPECT_EQ(packs.Discard(SetOf(3, {1})).size(), 1u) << "the aborted push's pack";
  EXPECT_FALSE(packs.Find(3, 0, 0).has_value());
  auto change = packs.Plan({}, {}, true, &unpacked);
  EXPECT_EQ(change.dead.size(), 2u) << "the committed pack and the uncommitted one";
  EXPECT_EQ(change.removals.count(PackIndexKey(1)), 1u);
  packs.Apply(change);
  EXPECT_FALSE(packs.Find(1, 0, 0).has_value());
  EXPECT_FALSE(packs.Find(2, 0, 0).has_value());
}

// A push that failed before its commit left packs under a seq the next attempt uses again: the
// commit takes only the records its manifest lists, and a pack holding none of them dies.
TEST(ModelPacksTest, RecordsOfAnAttemptThatNeverCommittedStayOutOfTheIndex) {
  ModelPacks packs("m", 1 << 20, kGrace);
  packs.Add(5, 3, 0, "stale");  // the failed attempt's tensor the next plan does not have
  ASSERT_TRUE(packs.Close().has_value());
  packs.Add(5, 0, 0, "a");
  ASSERT_TRUE(packs.Close().has_value());
  std::vector<StoreBackend::ChunkAddress> unpacked;
  auto change = packs.Plan({SetOf(5, {1})}, {}, false, &unpacked);
  EXPECT_EQ(change.dead.size(), 1u) << "the stale pack";
  packs.Apply(change);
  EXPECT_TRUE(packs.Find(5, 0, 0).has_value());
  EXPECT_FALSE(packs.Find(5, 3, 0).has_value());
}

// Readers that started before a commit find the records it made unreachable for the grace, and
// orphan removal leaves their packs; past it they are gone.
TEST(ModelPacksTest, RecordsACommitRetiredAreFoundForTheGrace) {
  for (const auto grace : {std::chrono::minutes(5), std::chrono::minutes(0)}) {
    ModelPacks packs("m", 1 << 20, grace);
    packs.Add(1, 0, 0, "a");
    ASSERT_TRUE(packs.Close().has_value());
    std::vector<StoreBackend::ChunkAddress> unpacked;
    packs.Apply(packs.Plan({SetOf(1, {1})}, {}, false, &unpacked));
    const auto at = packs.Find(1, 0, 0);
    ASSERT_TRUE(at.has_value());
    auto parsed = ParsePackKey("m", at->key);
    ASSERT_TRUE(parsed.has_value());
    auto change = packs.Plan({}, {SetOf(1, {1})}, false, &unpacked);
    ASSERT_EQ(change.dead.size(), 1u);
    packs.Apply(change);
    // The reader's rebuild from the log retires the same way.
    ModelPacks reader("m", 1 << 20, grace);
    ASSERT_TRUE(reader
                    .ApplyRecords(
                        {{PackIndexKey(1), EncodePackedSeq({{{parsed->id, {{0, 0, 0, 1}}}}})}}, {})
                    .ok());
    ASSERT_TRUE(reader.ApplyRecords({}, {PackIndexKey(1)}).ok());
    if (grace.count() > 0) {
      EXPECT_TRUE(packs.Find(1, 0, 0).has_value());
      EXPECT_TRUE(packs.Known(1, parsed->id));
      EXPECT_TRUE(reader.Find(1, 0, 0).has_value());
    } else {
      packs.Prune();
      EXPECT_FALSE(packs.Known(1, parsed->id));
      EXPECT_FALSE(packs.Find(1, 0, 0).has_value());
    }
    EXPECT_TRUE(packs.Committed(2).empty());
  }
}

}  // namespace
}  // namespace ckpt
