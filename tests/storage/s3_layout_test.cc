// The S3 bucket's metadata objects (backends/s3/s3_metadata_log.h) and the S3 API's XML
// (backends/s3/s3_xml.h): encodings are forever (golden bytes), damage is detected, names sort
// newest first.
#include <gtest/gtest.h>

#include <set>
#include <span>
#include <string>

#include "backends/s3/s3_metadata_log.h"
#include "backends/s3/s3_xml.h"
#include "ckpt/base/hashing.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::Hex;
using testing::Unhex;

using namespace s3_layout;

LogEntry SampleEntry() {
  LogEntry entry;
  entry.generation = 7;
  entry.epoch = 2;
  entry.token = "tok";
  entry.writer_url = "http://a";
  entry.sets = {{"m", "M"}, {"v\x01", std::string("\0\1", 2)}};
  entry.removals = {"t9"};
  return entry;
}

TEST(S3LayoutTest, LogEntriesRoundTripAndKeepTheirBytes) {
  const std::string encoded = EncodeLogEntry(SampleEntry());
  // Golden: a change of these bytes breaks every bucket already written.
  EXPECT_EQ(Hex(encoded),
            "434b53334c4f470a00000002000000000000000700000000000000020000000374"
            "6f6b00000008687474703a2f2f6100000002000000016d000000014d0000000276"
            "010000000200010000000100000002743993f5011b17081c48")
      << Hex(encoded);
  auto decoded = DecodeLogEntry(encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->generation, 7u);
  EXPECT_EQ(decoded->epoch, 2u);
  EXPECT_EQ(decoded->token, "tok");
  EXPECT_EQ(decoded->writer_url, "http://a");
  EXPECT_EQ(decoded->sets, SampleEntry().sets);
  EXPECT_EQ(decoded->removals, SampleEntry().removals);

  // Format 1 (entries without pack indexes) still reads.
  auto format1 =
      DecodeLogEntry(Unhex("434b53334c4f470a00000001000000000000000700000000000000020000000374"
                           "6f6b00000008687474703a2f2f6100000002000000016d000000014d0000000276"
                           "01000000020001000000010000000274391dbf6d23ecee742a"));
  ASSERT_TRUE(format1.ok()) << format1.status().ToString();
  EXPECT_EQ(format1->sets, SampleEntry().sets);
  EXPECT_EQ(format1->removals, SampleEntry().removals);
}

TEST(S3LayoutTest, SnapshotsRoundTrip) {
  Snapshot snapshot{33, 4, {{"m", "model"}, {"fa", "manifest"}}};
  auto decoded = DecodeSnapshot(EncodeSnapshot(snapshot));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->generation, 33u);
  EXPECT_EQ(decoded->epoch, 4u);
  EXPECT_EQ(decoded->records, snapshot.records);
  // A snapshot is not a log entry, nor the other way round.
  EXPECT_EQ(DecodeLogEntry(EncodeSnapshot(snapshot)).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSnapshot(EncodeLogEntry(SampleEntry())).status().code(), StatusCode::kDataLoss);
}

TEST(S3LayoutTest, DamageIsDataLossAndANewerFormatIsRefusedByName) {
  const std::string encoded = EncodeLogEntry(SampleEntry());
  for (size_t i = 0; i < encoded.size(); i += 7) {
    std::string damaged = encoded;
    damaged[i] ^= 0x20;
    EXPECT_FALSE(DecodeLogEntry(damaged).ok()) << "byte " << i;
  }
  for (size_t n = 0; n < encoded.size(); n += 5) {
    EXPECT_FALSE(DecodeLogEntry(encoded.substr(0, n)).ok()) << "cut at " << n;
  }
  // A newer format, sealed with a valid checksum: refused, saying why.
  std::string newer = encoded.substr(0, encoded.size() - 8);
  newer[11] = static_cast<char>(kFormatVersion + 1);
  const uint64_t sum =
      Xxh3Checksum(std::span(reinterpret_cast<const uint8_t*>(newer.data()), newer.size()));
  for (int i = 7; i >= 0; --i) newer += static_cast<char>((sum >> (8 * i)) & 0xff);
  auto refused = DecodeLogEntry(newer);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("newer ckptd"), std::string::npos);
}

TEST(S3LayoutTest, KeysListNewestFirstAndParseBack) {
  EXPECT_LT(LogKey("m", 9), LogKey("m", 8));
  EXPECT_LT(SnapshotKey("m", 1000), SnapshotKey("m", 999));
  EXPECT_EQ(GenerationOf(LogPrefix("m"), LogKey("m", 12345)), 12345u);
  EXPECT_EQ(GenerationOf(LogPrefix("m"), SnapshotKey("m", 1)), std::nullopt);
  EXPECT_EQ(LeaseKey("m"), "models/m/lease");

  const std::string key = ChunkKey("model.a", 0x10000000005, 3, 17);
  auto parsed = ParseChunkKey("model.a", key);
  ASSERT_TRUE(parsed.has_value()) << key;
  EXPECT_EQ(parsed->seq, 0x10000000005u);
  EXPECT_EQ(parsed->tensor, 3u);
  EXPECT_EQ(parsed->chunk, 17u);
  EXPECT_FALSE(ParseChunkKey("model", key).has_value()) << "another model's chunk";
  EXPECT_FALSE(ParseChunkKey("model.a", key + "x").has_value());
  // The chunks of one push spread over several prefixes.
  std::set<std::string> prefixes;
  for (uint64_t seq = 1; seq <= 64; ++seq) prefixes.insert(ChunkKey("m", seq, 0, 0).substr(0, 9));
  EXPECT_GE(prefixes.size(), 8u);
}

TEST(S3XmlTest, ListPagesErrorsAndUploadIdsParse) {
  auto page = s3_xml::ParseListPage(
      R"(<?xml version="1.0"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">)"
      R"(<IsTruncated>true</IsTruncated><NextContinuationToken>abc</NextContinuationToken>)"
      R"(<Contents><Key>p/a&amp;b</Key><Size>12</Size><ETag>"e1"</ETag></Contents>)"
      R"(<Contents><Key>p/c</Key><Size>0</Size><ETag>"e2"</ETag></Contents>)"
      R"(<CommonPrefixes><Prefix>p/d/</Prefix></CommonPrefixes></ListBucketResult>)");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a&b");
  EXPECT_EQ(page->objects[0].size, 12u);
  EXPECT_EQ(page->objects[0].etag, "e1");
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_continuation_token, "abc");
  EXPECT_EQ(page->common_prefixes, std::vector<std::string>{"p/d/"});
  EXPECT_FALSE(s3_xml::ParseListPage("<ListBucketResult><Contents>").ok());
  EXPECT_FALSE(
      s3_xml::ParseListPage("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>")
          .ok());

  auto error = s3_xml::ParseError("<Error><Code>SlowDown</Code><Message>m</Message></Error>");
  EXPECT_EQ(error.code, "SlowDown");
  EXPECT_EQ(error.message, "m");
  EXPECT_EQ(s3_xml::ParseError("not xml").code, "");
  auto id = s3_xml::ParseUploadId(
      "<InitiateMultipartUploadResult><UploadId>2~x</UploadId></InitiateMultipartUploadResult>");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "2~x");
  EXPECT_EQ(s3_xml::DeleteBody({"a<b"}),
            "<Delete><Quiet>true</Quiet><Object><Key>a&lt;b</Key></Object></Delete>");
}

}  // namespace
}  // namespace ckpt
