// The encoded pull body's format 2 (a part of a version), as docs/format.md lays it out: a body
// written by this build's encoders is byte for byte the golden one, and the golden one decodes
// to the box it announces.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/encoded_pull.h"
#include "ckpt/codec/tensor_codec.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::Hex;
using testing::Unhex;

// A stored F32 tensor of shape [4, 3] (0.5, 1.5, … 11.5) cut into chunks of 16 bytes; the part is
// its rows 2 and 3: elements 6 to 11, bytes 24 to 47, held by chunks 1 and 2.
std::vector<float> Stored() {
  std::vector<float> v(12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f + static_cast<float>(i);
  return v;
}

std::string GoldenWriterBody() {
  const std::vector<float> stored = Stored();
  const auto header = WriteSafetensorsHeader({TensorSpec{"w", DType::kF32, {2, 3}, {}}}, {});
  EXPECT_TRUE(header.ok());
  std::string body = EncodePartPullPreamble(7, *header);
  const std::vector<uint64_t> shape{4, 3}, offsets{2, 0};
  body += EncodePartFrame(0, 48, 16, shape, offsets);
  const TensorCodec* codec = *CodecForDecoding(static_cast<uint16_t>(CodecId::kLosslessBytePlanes));
  for (uint32_t chunk = 1; chunk <= 2; ++chunk) {
    const std::span<const uint8_t> bytes(
        reinterpret_cast<const uint8_t*>(stored.data()) + chunk * 16, 16);
    auto encoded = codec->Encode(DType::kF32, bytes, std::nullopt);
    EXPECT_TRUE(encoded.ok());
    const std::string record = ChunkRecord::EncodeChunk(*encoded, FrameKind::kKeyframe, bytes);
    body += EncodeLinkFrameHead(0, chunk, LinkBase::kNone, record.size());
    body += record;
  }
  body += EncodePullEnd();
  return body;
}

// docs/format.md, "Format 2": the preamble (version 7), the header of w [2, 3], the part frame
// (stored [4, 3], 48 bytes in chunks of 16, box at [2, 0]), the links of chunks 1 and 2 (lossless
// keyframes, planes stored), the end.
constexpr std::string_view kGoldenHex =
    "434b505450554c0207000000000000000000000000000000480000000000000040000000000000007b2277223a7b22"
    "64"
    "6174615f6f666673657473223a5b302c32345d2c226474797065223a22463332222c227368617065223a5b322c335d"
    "7d"
    "7d20202020202020030000000030000000000000001000000000000000020400000000000000030000000000000002"
    "00"
    "0000000000000000000000000000010000000001000000004a0000000000000001010001100000000000000098e493"
    "1a"
    "c468b10f46d7fb24f821a0ee0104100000000000000000040000000004000000000400000000040000000000000000"
    "00"
    "000090b0d0f040404040010000000002000000004a00000000000000010100011000000000000000da00f46b41da17"
    "1d"
    "d0222429fa6100b2010410000000000000000004000000000400000000040000000004000000000000000000000008"
    "18"
    "28384141414102";

TEST(EncodedPullFormat2, WritesTheGoldenBodyAndDecodesItToTheBox) {
  EXPECT_EQ(Hex(GoldenWriterBody()), kGoldenHex);

  const std::string golden = Unhex(kGoldenHex);
  std::string out;
  EncodedPullDecoder decoder(nullptr, [&](std::string_view bytes) {
    out.append(bytes);
    return Status::Ok();
  });
  ASSERT_TRUE(decoder.Feed({reinterpret_cast<const uint8_t*>(golden.data()), golden.size()}).ok());
  ASSERT_TRUE(decoder.Finish().ok());
  EXPECT_FALSE(decoder.whole_version());
  EXPECT_EQ(decoder.version(), 7u);
  const std::vector<float> stored = Stored();
  const std::string header =
      *WriteSafetensorsHeader({TensorSpec{"w", DType::kF32, {2, 3}, {}}}, {});
  ASSERT_EQ(out.size(), header.size() + 24);
  EXPECT_EQ(out.substr(0, header.size()), header);
  EXPECT_EQ(std::memcmp(out.data() + header.size(), stored.data() + 6, 24), 0);
}

// Part frames whose sizes overflow or exceed any chunk are refused before anything is read or
// allocated by them.
TEST(EncodedPullFormat2, RefusesPartFramesOutOfRange) {
  const std::string golden = Unhex(kGoldenHex);
  const std::string header =
      *WriteSafetensorsHeader({TensorSpec{"w", DType::kF32, {2, 3}, {}}}, {});
  const size_t frame = 32 + header.size();
  const size_t frame_end = frame + 22 + 4 * 8;
  auto decode = [](const std::string& body) {
    EncodedPullDecoder decoder(nullptr, [](std::string_view) { return Status::Ok(); });
    Status s = decoder.Feed({reinterpret_cast<const uint8_t*>(body.data()), body.size()});
    return s.ok() ? decoder.Finish() : s;
  };
  struct Case {
    uint64_t stored_bytes, chunk_bytes;
    std::vector<uint64_t> shape;
  };
  for (const Case& c : {Case{48, 16, {uint64_t{1} << 62, 3}},  // shape × element overflows
                        Case{0, 16, {uint64_t{1} << 62, 0}},   // no bytes, and the box past it
                        Case{48, uint64_t{1} << 40, {4, 3}},   // a chunk longer than any
                        Case{48, 0, {4, 3}},                   // no chunk length
                        Case{64, 16, {4, 3}}}) {               // bytes not the shape's
    std::string body =
        golden.substr(0, frame) +
        EncodePartFrame(0, c.stored_bytes, c.chunk_bytes, c.shape, std::vector<uint64_t>{2, 0}) +
        golden.substr(frame_end);
    EXPECT_EQ(decode(body).code(), StatusCode::kInvalidArgument) << c.chunk_bytes;
  }
  EXPECT_TRUE(decode(golden).ok());
}

}  // namespace
}  // namespace ckpt
