// Round trips and corruption handling of every persisted record (storage/src/records.h).
#include "records/records.h"

#include <gtest/gtest.h>

#include <bit>
#include <functional>

#include "ckpt/base/binary.h"
#include "ckpt/base/hashing.h"
#include "context/reference_cache.h"
#include "records/keys.h"

namespace ckpt {
namespace {

template <typename Record>
void ExpectTruncationsAreDataLoss(const std::string& bytes) {
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = Record::DecodeFrom(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes decoded";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  }
  std::string bad_version = bytes;
  bad_version[0] = 99;
  auto r = Record::DecodeFrom(bad_version);
  ASSERT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("format version 99"), std::string::npos);
}

TEST(Records, ModelRecordRoundTrips) {
  ModelRecord m;
  m.created_at_ms = 1764400000123;
  m.policy_json = R"({"keyframe_every":4,"mode":"lossless"})";
  m.has_versions = true;
  m.latest_version = UINT64_MAX;
  m.version_count = 7;
  m.raw_bytes = 1ull << 40;
  m.stored_bytes = 12345;
  m.retention_json = R"({"keep_last":3})";
  const std::string bytes = Encoded(m);
  auto d = ModelRecord::DecodeFrom(bytes);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->retention_json, m.retention_json);
  EXPECT_EQ(d->created_at_ms, m.created_at_ms);
  EXPECT_EQ(d->policy_json, m.policy_json);
  EXPECT_EQ(d->has_versions, m.has_versions);
  EXPECT_EQ(d->latest_version, m.latest_version);
  EXPECT_EQ(d->version_count, m.version_count);
  EXPECT_EQ(d->raw_bytes, m.raw_bytes);
  EXPECT_EQ(d->stored_bytes, m.stored_bytes);
  ExpectTruncationsAreDataLoss<ModelRecord>(bytes);
}

TEST(Records, VersionRecordRoundTripsIncludingRawHeader) {
  VersionRecord v;
  v.seq = 42;
  v.floor_seq = 33;
  v.created_at_ms = 17;
  v.raw_bytes = 999;
  v.stored_bytes = 500;
  v.kind = 3;
  v.tensor_count = 2;
  v.sha256_hex = std::string(64, 'a');
  v.raw_header = std::string("\x10\0\0\0\0\0\0\0{\"a\":1}   \0", 19);
  v.restored_sha256_hex = std::string(64, 'b');
  v.lossy = true;
  v.metrics = {{"loss", 1.25}, {"acc", -0.0}};
  v.labels = {{"run", "a1"}, {"empty", ""}};
  v.dropped_tensors = {1, 5};
  const std::string bytes = Encoded(v);
  auto d = VersionRecord::DecodeFrom(bytes);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->metrics, v.metrics);
  EXPECT_EQ(d->labels, v.labels);
  EXPECT_EQ(d->seq, 42u);
  EXPECT_EQ(d->floor_seq, 33u);
  EXPECT_EQ(d->kind, 3);
  EXPECT_EQ(d->tensor_count, 2u);
  EXPECT_EQ(d->sha256_hex, v.sha256_hex);
  EXPECT_EQ(d->raw_header, v.raw_header);
  EXPECT_EQ(d->restored_sha256_hex, v.restored_sha256_hex);
  EXPECT_TRUE(d->lossy);
  EXPECT_EQ(d->dropped_tensors, v.dropped_tensors);
  EXPECT_TRUE(d->Dropped(5));
  EXPECT_FALSE(d->Dropped(2));
  ExpectTruncationsAreDataLoss<VersionRecord>(bytes);
  // Dropped tensors out of order are corruption.
  v.dropped_tensors = {5, 1};
  EXPECT_EQ(VersionRecord::DecodeFrom(Encoded(v)).status().code(), StatusCode::kDataLoss);
  // A format-3 record (no dropped tensors field) still decodes: format 4 appended the field.
  v.dropped_tensors.clear();
  std::string format3 = Encoded(v);
  format3.resize(format3.size() - 4);
  format3[0] = 3;
  auto old = VersionRecord::DecodeFrom(format3);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_TRUE(old->dropped_tensors.empty());
  EXPECT_EQ(old->labels, v.labels);
  EXPECT_EQ(VersionRecord::DecodeFrom(bytes + "x").status().code(), StatusCode::kDataLoss);
}

TEST(Records, ManifestRecordRoundTripsEveryTensorField) {
  ManifestRecord m;
  m.version = 1200;
  m.floor_seq = 5;
  m.stored_bytes = 77;
  ManifestTensor a;
  a.name = "layer.0.weight";
  a.dtype = DType::kBF16;
  a.shape = {4096, 11008};
  a.byte_size = 4096ull * 11008 * 2;
  a.chunk_bytes = 4 << 20;
  a.chunk_count = 22;
  a.kind = FrameKind::kDelta;
  a.base_seq = 9;
  a.base_tensor = 3;
  a.keyframe_seq = 5;
  a.chain_length = 4;
  a.codec_id = static_cast<uint16_t>(CodecId::kLossyQuantized);
  a.quantizer = 1;
  a.bound = 5e-3;
  a.stored_bytes = 123456;
  a.keyframe_bytes = 999999;
  a.chain_bytes = 400000;
  a.entropy_bits = 987654.5;
  a.exact_elements = 3;
  ManifestTensor scalar;
  scalar.name = "step";
  scalar.dtype = DType::kI64;
  scalar.byte_size = 8;
  scalar.chunk_bytes = 8;
  scalar.chunk_count = 1;
  m.tensors = {a, scalar};
  const std::string bytes = Encoded(m);
  auto d = ManifestRecord::DecodeFrom(bytes);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->tensors.size(), 2u);
  const auto& t = d->tensors[0];
  EXPECT_EQ(t.name, a.name);
  EXPECT_EQ(t.dtype, a.dtype);
  EXPECT_EQ(t.shape, a.shape);
  EXPECT_EQ(t.byte_size, a.byte_size);
  EXPECT_EQ(t.chunk_bytes, a.chunk_bytes);
  EXPECT_EQ(t.chunk_count, a.chunk_count);
  EXPECT_EQ(t.kind, a.kind);
  EXPECT_EQ(t.base_seq, a.base_seq);
  EXPECT_EQ(t.base_tensor, a.base_tensor);
  EXPECT_EQ(t.keyframe_seq, a.keyframe_seq);
  EXPECT_EQ(t.chain_length, a.chain_length);
  EXPECT_EQ(t.codec_id, a.codec_id);
  EXPECT_EQ(t.quantizer, a.quantizer);
  EXPECT_EQ(t.bound, a.bound);
  EXPECT_EQ(t.stored_bytes, a.stored_bytes);
  EXPECT_EQ(t.keyframe_bytes, a.keyframe_bytes);
  EXPECT_EQ(t.chain_bytes, a.chain_bytes);
  EXPECT_EQ(t.entropy_bits, a.entropy_bits);
  EXPECT_EQ(t.exact_elements, a.exact_elements);
  EXPECT_EQ(d->tensors[1].codec_id, static_cast<uint16_t>(CodecId::kLosslessBytePlanes));
  EXPECT_TRUE(d->tensors[1].shape.empty());
  ExpectTruncationsAreDataLoss<ManifestRecord>(bytes);
}

// A tiled tensor's grid is format 4; a manifest without one stays format 3, readable by builds
// that predate tiles.
TEST(Records, ManifestRecordKeepsTilesInFormatFourOnly) {
  ManifestRecord m;
  ManifestTensor w;
  w.name = "mlp.down.weight";
  w.dtype = DType::kF32;
  w.shape = {64, 128};
  w.byte_size = 64 * 128 * 4;
  w.chunk_bytes = 64 * 32 * 4;
  w.chunk_count = 1;
  m.tensors = {w};
  EXPECT_EQ(Encoded(m)[0], 3);
  auto untiled = ManifestRecord::DecodeFrom(Encoded(m));
  ASSERT_TRUE(untiled.ok());
  EXPECT_TRUE(untiled->tensors[0].tile_counts.empty());
  EXPECT_FALSE(untiled->tensors[0].Grid().ok()) << "4 chunks, the manifest says 1";

  const size_t untiled_bytes = Encoded(m).size();
  m.tensors[0].tile_counts = {1, 4};
  m.tensors[0].chunk_count = 4;
  const std::string bytes = Encoded(m);
  EXPECT_EQ(bytes[0], 4);
  EXPECT_EQ(bytes.size(), untiled_bytes + 12);  // u32 count, two u32 counts
  auto tiled = ManifestRecord::DecodeFrom(bytes);
  ASSERT_TRUE(tiled.ok()) << tiled.status().ToString();
  EXPECT_EQ(tiled->tensors[0].tile_counts, (std::vector<uint32_t>{1, 4}));
  auto grid = tiled->tensors[0].Grid();
  ASSERT_TRUE(grid.ok()) << grid.status().ToString();
  EXPECT_EQ(grid->TileBox(3), (TensorBox{{0, 96}, {64, 32}}));
  ExpectTruncationsAreDataLoss<ManifestRecord>(bytes);
  // Counts that are no grid of several tiles, or a grid the other fields contradict.
  for (const auto& mutate : std::vector<std::function<void(ManifestTensor&)>>{
           [](ManifestTensor& t) {
             t.tile_counts = {1, 5};
           },  // 128 columns in 5
           [](ManifestTensor& t) {
             t.tile_counts = {1, 1};  // one tile
             t.chunk_count = 1;
           },
           [](ManifestTensor& t) { t.chunk_count = 3; },    // the grid has 4
           [](ManifestTensor& t) { t.byte_size /= 2; }}) {  // not its shape's
    ManifestRecord bad = m;
    mutate(bad.tensors[0]);
    EXPECT_EQ(ManifestRecord::DecodeFrom(Encoded(bad)).status().code(), StatusCode::kDataLoss);
  }
  // Counts of another rank than the shape's are not a grid.
  std::string wrong = bytes;
  wrong[wrong.size() - 12] = 3;  // the count of counts (u32 LE)
  EXPECT_EQ(ManifestRecord::DecodeFrom(wrong).status().code(), StatusCode::kDataLoss);
}

// A manifest record of `format` with one F32 tensor "w" of shape {2, 3}, a delta against
// manifest 4 with its keyframe in 5, up to the end of its format-1 fields.
ByteWriter OneTensorManifestUpToFormatOneFields(uint8_t format) {
  ByteWriter m;
  m.PutU8(format);
  m.PutU64(1200);  // version
  m.PutU64(5);     // floor_seq
  m.PutU64(77);    // stored_bytes
  m.PutU32(1);     // tensor_count
  m.PutLengthPrefixed("w");
  m.PutU8(static_cast<uint8_t>(DType::kF32));
  m.PutU32(2);
  m.PutU64(2);
  m.PutU64(3);
  m.PutU64(24);  // byte_size
  m.PutU64(24);  // chunk_bytes
  m.PutU32(1);   // chunk_count
  m.PutU8(static_cast<uint8_t>(FrameKind::kDelta));
  m.PutU64(4);  // base_seq
  m.PutU32(0);  // base_tensor
  m.PutU64(5);  // keyframe_seq
  m.PutU32(1);  // chain_length
  return m;
}

// Formats are forever: records written in format 1 (before lossy coding) still decode, with the
// restored body equal to the pushed one and every tensor lossless. The bytes are built field by
// field from the format-1 layout in docs/format.md, not with today's encoder.
TEST(Records, FormatOneVersionAndManifestRecordsStillDecode) {
  ByteWriter v;
  v.PutU8(1);
  v.PutU64(7);    // seq
  v.PutU64(3);    // floor_seq
  v.PutU64(11);   // created_at_ms
  v.PutU64(100);  // raw_bytes
  v.PutU64(60);   // stored_bytes
  v.PutU8(2);     // kind: delta
  v.PutU32(1);    // tensor_count
  v.PutLengthPrefixed(std::string(64, 'c'));
  v.PutLengthPrefixed64("header");
  auto version = VersionRecord::DecodeFrom(v.data());
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  EXPECT_EQ(version->seq, 7u);
  EXPECT_EQ(version->restored_sha256_hex, std::string(64, 'c'));
  EXPECT_FALSE(version->lossy);
  EXPECT_EQ(version->raw_header, "header");

  ByteWriter m = OneTensorManifestUpToFormatOneFields(1);
  auto manifest = ManifestRecord::DecodeFrom(m.data());
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  ASSERT_EQ(manifest->tensors.size(), 1u);
  const ManifestTensor& t = manifest->tensors[0];
  EXPECT_EQ(t.shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(t.chain_length, 1u);
  EXPECT_EQ(t.codec_id, static_cast<uint16_t>(CodecId::kLosslessBytePlanes));
  EXPECT_EQ(t.quantizer, 0);
  EXPECT_EQ(t.stored_bytes, 0u);
  // A format-1 record with format-2 fields appended is not format 1: trailing bytes.
  EXPECT_EQ(ManifestRecord::DecodeFrom(m.data() + std::string(8, '\0')).status().code(),
            StatusCode::kDataLoss);
}

// A format-2 manifest (without the reserved field) still decodes: the bytes follow the
// format-2 layout in docs/format.md.
TEST(Records, FormatTwoManifestRecordsStillDecode) {
  ByteWriter m = OneTensorManifestUpToFormatOneFields(2);
  m.PutU16(static_cast<uint16_t>(CodecId::kLossyQuantized));
  m.PutU8(5);                               // quantizer: log
  m.PutU64(std::bit_cast<uint64_t>(0.3));   // bound
  m.PutU64(90);                             // stored_bytes
  m.PutU64(90);                             // keyframe_bytes
  m.PutU64(0);                              // chain_bytes
  m.PutU64(std::bit_cast<uint64_t>(12.5));  // entropy_bits
  m.PutU64(1);                              // exact_elements
  auto manifest = ManifestRecord::DecodeFrom(m.data());
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  ASSERT_EQ(manifest->tensors.size(), 1u);
  EXPECT_EQ(manifest->tensors[0].bound, 0.3);
  EXPECT_EQ(manifest->tensors[0].exact_elements, 1u);
  // A format-2 record with the format-3 field appended is not format 2: trailing bytes.
  EXPECT_EQ(ManifestRecord::DecodeFrom(m.data() + std::string(8, '\0')).status().code(),
            StatusCode::kDataLoss);
}

TEST(Records, ChunkRecordRoundTripsAndDetectsPayloadCorruption) {
  const std::string payload = "compressed bytes";
  ChunkRecord c;
  c.codec_id = 1;
  c.kind = FrameKind::kKeyframe;
  c.raw_length = 4096;
  c.raw_checksum = 0x1234;
  c.payload = payload;
  c.payload_checksum = Xxh3Checksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  const std::string bytes = Encoded(c);
  auto d = ChunkRecord::DecodeFrom(bytes);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->codec_id, 1);
  EXPECT_EQ(d->kind, FrameKind::kKeyframe);
  EXPECT_EQ(d->raw_length, 4096u);
  EXPECT_EQ(d->raw_checksum, 0x1234u);
  EXPECT_EQ(d->payload, payload);
  std::string flipped = bytes;
  flipped.back() ^= 1;
  auto bad = ChunkRecord::DecodeFrom(flipped);
  ASSERT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("checksum"), std::string::npos);
  std::string bad_kind = bytes;
  bad_kind[3] = 7;
  EXPECT_EQ(ChunkRecord::DecodeFrom(bad_kind).status().code(), StatusCode::kDataLoss);
}

TEST(Records, CodecStateRecordRoundTrips) {
  CodecStateRecord s{123, 100, 130};
  const std::string bytes = Encoded(s);
  auto d = CodecStateRecord::DecodeFrom(bytes);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->reference_seq, 123u);
  EXPECT_EQ(d->reference_floor_seq, 100u);
  EXPECT_EQ(d->next_seq, 130u);
  ExpectTruncationsAreDataLoss<CodecStateRecord>(bytes);
}

// The count of space awaiting compaction: format byte, then the bytes as u64 little-endian;
// its key sits under a prefix of its own in the default family.
TEST(Records, AwaitingCompactionRecordIsFormatOneAndItsBytes) {
  const std::string bytes = Encoded(AwaitingCompactionRecord{0x0102030405060708ull});
  EXPECT_EQ(bytes, std::string("\x01\x08\x07\x06\x05\x04\x03\x02\x01", 9));
  auto d = AwaitingCompactionRecord::DecodeFrom(bytes);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->bytes, 0x0102030405060708ull);
  ExpectTruncationsAreDataLoss<AwaitingCompactionRecord>(bytes);
  std::string newer = bytes;
  newer[0] = 2;
  EXPECT_EQ(AwaitingCompactionRecord::DecodeFrom(newer).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(storage_keys::AwaitingCompactionKey("m"), std::string("awaiting-compaction\0m", 21));
}

// Model records of format 1 (before retention) decode with no retention policy set; version
// records of format 2 (before metrics) with none.
// The tag layout has no format byte: the exact eight bytes are the format.
TEST(Records, TagRecordIsTheVersionBigEndianAndRejectsOtherLengths) {
  const std::string bytes = Encoded(TagRecord{0x0102030405060708ull});
  EXPECT_EQ(bytes, std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  auto decoded = TagRecord::DecodeFrom(bytes);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->version, 0x0102030405060708ull);
  for (const std::string& bad : {std::string(), std::string(7, '\0'), std::string(9, '\0')}) {
    EXPECT_EQ(TagRecord::DecodeFrom(bad).status().code(), StatusCode::kDataLoss) << bad.size();
  }
}

TEST(Records, OlderModelAndVersionRecordsStillDecode) {
  ByteWriter m;
  m.PutU8(1);
  m.PutU64(5);  // created_at_ms
  m.PutLengthPrefixed("");
  m.PutU8(1);
  m.PutU64(300);  // latest_version
  m.PutU64(3);
  m.PutU64(30);
  m.PutU64(20);
  auto model = ModelRecord::DecodeFrom(m.data());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->latest_version, 300u);
  EXPECT_TRUE(model->retention_json.empty());

  ByteWriter v;
  v.PutU8(2);
  for (int i = 0; i < 5; ++i) v.PutU64(i);
  v.PutU8(1);
  v.PutU32(1);
  v.PutLengthPrefixed(std::string(64, 'c'));
  v.PutLengthPrefixed64("header");
  v.PutLengthPrefixed(std::string(64, 'd'));
  v.PutU8(1);
  auto version = VersionRecord::DecodeFrom(v.data());
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  EXPECT_TRUE(version->lossy);
  EXPECT_TRUE(version->metrics.empty());
  EXPECT_TRUE(version->labels.empty());
}

// Format 1 (before garbage collection could allocate seqs) had no next_seq: the next manifest
// follows the reference.
TEST(Records, FormatOneCodecStateRecordStillDecodes) {
  ByteWriter w;
  w.PutU8(1);
  w.PutU64(9);  // reference_seq
  w.PutU64(4);  // reference_floor_seq
  auto d = CodecStateRecord::DecodeFrom(w.data());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->reference_seq, 9u);
  EXPECT_EQ(d->next_seq, 10u);
}

ReferenceCache::Chunk Bytes(size_t n, uint8_t fill) {
  return std::make_shared<const std::vector<uint8_t>>(n, fill);
}

TEST(ReferenceCache, EvictsLeastRecentlyUsedWithinBudget) {
  ReferenceCache cache(300);
  cache.Put("m", 1, 0, 0, Bytes(100, 1));
  cache.Put("m", 1, 0, 1, Bytes(100, 2));
  cache.Put("m", 1, 0, 2, Bytes(100, 3));
  ASSERT_NE(cache.Get("m", 1, 0, 0), nullptr);  // now most recently used
  cache.Put("m", 2, 0, 0, Bytes(100, 4));       // evicts chunk 1 (least recently used)
  EXPECT_EQ(cache.Get("m", 1, 0, 1), nullptr);
  EXPECT_NE(cache.Get("m", 1, 0, 0), nullptr);
  EXPECT_EQ(cache.size_bytes(), 300u);
  cache.Put("huge", 1, 0, 0, Bytes(301, 5));  // larger than the budget: not cached
  EXPECT_EQ(cache.Get("huge", 1, 0, 0), nullptr);
}

TEST(ReferenceCache, DropModelExceptKeepsOnlyTheNamedSeq) {
  ReferenceCache cache(1000);
  cache.Put("m", 1, 0, 0, Bytes(10, 1));
  cache.Put("m", 2, 0, 0, Bytes(10, 2));
  cache.Put("other", 1, 0, 0, Bytes(10, 3));
  cache.DropModelExcept("m", 2);
  EXPECT_EQ(cache.Get("m", 1, 0, 0), nullptr);
  EXPECT_EQ((*cache.Get("m", 2, 0, 0))[0], 2);
  EXPECT_NE(cache.Get("other", 1, 0, 0), nullptr);
  EXPECT_EQ(cache.size_bytes(), 20u);
}

TEST(ReferenceCache, RestoredChunksAreEvictedBeforeReferences) {
  using Kind = ReferenceCache::Kind;
  ReferenceCache cache(300);
  cache.Put("a", 1, 0, 0, Bytes(100, 1));
  cache.Put("b", 1, 0, 0, Bytes(100, 2));
  cache.Put("m", 5, 0, 0, Bytes(100, 3), Kind::kRestored);
  cache.Put("m", 6, 0, 0, Bytes(100, 4), Kind::kRestored);  // evicts seq 5, not a reference
  EXPECT_EQ(cache.Get("m", 5, 0, 0), nullptr);
  EXPECT_NE(cache.Get("m", 6, 0, 0), nullptr);
  EXPECT_NE(cache.Get("a", 1, 0, 0), nullptr);
  EXPECT_NE(cache.Get("b", 1, 0, 0), nullptr);
  EXPECT_EQ(cache.size_bytes(Kind::kRestored), 100u);
  // A reference evicts restored chunks first, then the least recently used reference.
  cache.Put("c", 1, 0, 0, Bytes(100, 5));
  EXPECT_EQ(cache.Get("m", 6, 0, 0), nullptr);
  EXPECT_EQ(cache.size_bytes(Kind::kReference), 300u);
  cache.Put("d", 1, 0, 0, Bytes(100, 6));
  EXPECT_EQ(cache.Get("a", 1, 0, 0), nullptr);
  // Put again as restored, a reference stays a reference.
  cache.Put("d", 1, 0, 0, Bytes(100, 7), Kind::kRestored);
  EXPECT_EQ(cache.size_bytes(Kind::kRestored), 0u);
  EXPECT_EQ((*cache.Get("d", 1, 0, 0))[0], 7);
  // Dropping and rekeying cover both kinds.
  cache.Erase("b", 1, 0, 0);
  cache.Put("d", 2, 0, 0, Bytes(50, 8), Kind::kRestored);
  ASSERT_EQ(cache.size_bytes(), 250u);
  cache.Rekey("d", 2, 9);
  EXPECT_EQ(cache.Get("d", 2, 0, 0), nullptr);
  EXPECT_EQ((*cache.Get("d", 9, 0, 0))[0], 8);
  cache.DropModelExcept("d", 0);
  EXPECT_EQ(cache.Get("d", 9, 0, 0), nullptr);
  EXPECT_EQ(cache.Get("d", 1, 0, 0), nullptr);
  EXPECT_EQ(cache.size_bytes(), 100u);  // "c" alone
}

TEST(ReferenceCache, PutsFromBeforeAWholeModelDropAreIgnored) {
  ReferenceCache cache(1000);
  const uint64_t before = cache.generation();
  cache.DropModelExcept("m", 7);  // a push moving the reference: not a whole drop
  EXPECT_EQ(cache.generation(), before);
  cache.DropModelExcept("m", 0);  // deleted
  cache.Put("m", 1, 0, 0, Bytes(10, 1), ReferenceCache::Kind::kRestored, before);
  EXPECT_EQ(cache.Get("m", 1, 0, 0), nullptr);
  cache.Put("m", 1, 0, 0, Bytes(10, 2), ReferenceCache::Kind::kRestored, cache.generation());
  EXPECT_NE(cache.Get("m", 1, 0, 0), nullptr);
  cache.Put("m", 2, 0, 0, Bytes(10, 3));  // pushes hold the model's lock: any generation
  EXPECT_NE(cache.Get("m", 2, 0, 0), nullptr);
  // A reader from before the drop does not see the new model's entries either.
  EXPECT_EQ(cache.Get("m", 2, 0, 0, before), nullptr);
  EXPECT_NE(cache.Get("m", 2, 0, 0, cache.generation()), nullptr);
}

TEST(ReferenceCache, DemotedReferencesAreEvictedFirst) {
  using Kind = ReferenceCache::Kind;
  ReferenceCache cache(300);
  cache.Put("m", 1, 0, 0, Bytes(100, 1));
  cache.Put("m", 1, 0, 1, Bytes(100, 2));
  cache.Put("other", 1, 0, 0, Bytes(100, 3));
  cache.Demote("m", 1, 0, 0);  // a push consumed it
  EXPECT_EQ(cache.size_bytes(Kind::kRestored), 100u);
  cache.Put("m", 2, 0, 0, Bytes(100, 4));  // evicts the demoted chunk, not a reference
  EXPECT_EQ(cache.Get("m", 1, 0, 0), nullptr);
  EXPECT_NE(cache.Get("other", 1, 0, 0), nullptr);
  cache.DemoteModelExcept("m", 2);  // the push committed: seq 1 is no reference any more
  EXPECT_EQ(cache.size_bytes(Kind::kRestored), 100u);
  EXPECT_EQ(cache.size_bytes(Kind::kReference), 200u);
  EXPECT_EQ((*cache.Get("m", 1, 0, 1))[0], 2);  // still there until space is needed
  cache.Put("x", 1, 0, 0, Bytes(100, 5));
  EXPECT_EQ(cache.Get("m", 1, 0, 1), nullptr);
  EXPECT_NE(cache.Get("m", 2, 0, 0), nullptr);
}

}  // namespace
}  // namespace ckpt
