// Coding at the edge: the coding plan's JSON, the encoded push body's framing, and the client's
// encoder (coding_plan.h, encoded_body.h, edge_encoder.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ckpt/base/hashing.h"
#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::FloatBytes;
using testing::OwnedTensor;
using testing::Serialize;

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::vector<float> Weights(size_t n, uint64_t seed, float drift = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0, 0.05f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = d(rng) + drift * std::sin(static_cast<float>(i));
  return v;
}

std::string Checkpoint(float drift) {
  return Serialize({{"a.weight", DType::kF32, {64, 96}, FloatBytes(Weights(64 * 96, 1, drift))},
                    {"b.bias", DType::kF32, {96}, FloatBytes(Weights(96, 2, drift))},
                    {"empty", DType::kF32, {0}, ""},
                    {"steps", DType::kI64, {1}, std::string(8, '\3')}});
}

// The plan a daemon would hand out for Checkpoint(): chunks of `chunk_bytes`, weights lossy
// at `bound` (0: lossless), deltas when `base` is set.
CodingPlan PlanFor(const CheckpointView& view, uint64_t chunk_bytes, double bound,
                   std::optional<PlanBase> base) {
  CodingPlan plan;
  plan.model = "m";
  plan.version = base ? base->version + 1 : 1;
  plan.base = base;
  for (const TensorInfo& t : view.header().tensors) {
    PlannedTensor p;
    p.name = t.name;
    p.dtype = t.dtype;
    p.shape = t.shape;
    p.byte_size = t.byte_size();
    p.chunk_bytes = std::max<uint64_t>(DTypeSize(t.dtype), std::min(chunk_bytes, p.byte_size));
    p.chunk_count = static_cast<uint32_t>((p.byte_size + p.chunk_bytes - 1) / p.chunk_bytes);
    p.kind = base ? FrameKind::kDelta : FrameKind::kKeyframe;
    p.lossy = bound > 0 && t.dtype == DType::kF32;
    if (p.lossy) {
      p.lossy_options.quantizer = Quantizer::kUniform;
      p.lossy_options.bound = {ErrorBound::Kind::kAbsolute, bound};
    }
    plan.tensors.push_back(p);
  }
  return plan;
}

// What a daemon sees of an encoded body.
struct Received : EncodedBodySink {
  EncodedBodyPreamble preamble;
  std::vector<EncodedChunkFrame> frames;
  std::vector<std::string> records;
  EncodedBodyEnd end;
  Status OnPreamble(const EncodedBodyPreamble& p) override {
    preamble = p;
    return Status::Ok();
  }
  Status OnChunk(const EncodedChunkFrame& f) override {
    frames.push_back(f);
    records.emplace_back(f.record);
    frames.back().record = {};
    return Status::Ok();
  }
  Status OnEnd(const EncodedBodyEnd& e) override {
    end = e;
    return Status::Ok();
  }
};

struct Encoded {
  std::string body;
  std::vector<uint8_t> reconstruction;
  EdgeEncoding result;
};

Encoded EncodeOrDie(const CodingPlan& plan, const CheckpointView& view,
                    const CheckpointView* reference, int threads = 2) {
  Encoded e;
  auto result = EncodeByPlan(
      plan, view, reference, threads,
      [&](std::string_view piece) {
        e.body.append(piece);
        return Status::Ok();
      },
      CollectInto(&e.reconstruction));
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  if (result.ok()) e.result = *result;
  return e;
}

TEST(CodingPlan, JsonRoundTripsAndItsDigestIsStable) {
  const std::string body = Checkpoint(0);
  const auto view = CheckpointView::Parse(Bytes(body));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  CodingPlan plan = PlanFor(*view, 1000, 5e-3, PlanBase{7, 12, std::string(64, 'a')});
  plan.tensors[0].lossy_options.low_rank_columns = 96;
  plan.tensors[0].lossy_options.zero_below_mean = 0.1;
  const auto parsed = CodingPlan::FromJson(plan.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, plan);
  EXPECT_EQ(parsed->Digest(), plan.Digest());
  CodingPlan other = plan;
  other.tensors[1].lossy_options.bound.value = 4e-3;
  EXPECT_NE(other.Digest(), plan.Digest());
  other = plan;
  other.base->reference = 13;
  EXPECT_NE(other.Digest(), plan.Digest());
  other = plan;
  other.base->restored_sha256 = std::string(64, 'b');
  EXPECT_EQ(other.Digest(), plan.Digest());
}

TEST(CodingPlan, FromJsonRefusesWhatItCannotFollow) {
  const std::string body = Checkpoint(0);
  const auto view = CheckpointView::Parse(Bytes(body));
  ASSERT_TRUE(view.ok());
  const std::string good = PlanFor(*view, 1000, 5e-3, PlanBase{7, 12, ""}).ToJson();
  SCOPED_TRACE(good);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    if (at == std::string::npos) {
      ADD_FAILURE() << "no " << from;
      return good;
    }
    return text.replace(at, from.size(), to);
  };
  for (const std::string& bad :
       {std::string("{"), std::string("[]"), with("\"format\":1", "\"format\":3"),
        with("\"chunk_count\":25,", "\"chunk_count\":26,\"tiles\":[1,2],"),
        with("\"format\":1", "\"format\":2")
            .replace(good.find("\"chunk_count\":25,"), 17, "\"chunk_count\":25,\"tiles\":[1,5],"),
        with("\"quantizer\":\"uniform\"", "\"quantizer\":\"fancy\""),
        with("\"dtype\":\"F32\"", "\"dtype\":\"F33\""),
        with("\"kind\":\"delta\"", "\"kind\":\"sideways\""),
        with("\"chunk_count\":25", "\"chunk_count\":26"),
        with("\"base\":{", "\"base\":null,\"x\":{"), with("\"tensors\":[", "\"tensors\":[1,")}) {
    const auto plan = CodingPlan::FromJson(bad);
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // The same tiles in format 2 are a plan: only format 1 refused them.
  std::string tiled = with("\"chunk_count\":25,", "\"chunk_count\":26,\"tiles\":[1,2],");
  tiled.replace(tiled.find("\"format\":1"), 10, "\"format\":2");
  EXPECT_TRUE(CodingPlan::FromJson(tiled).ok()) << tiled;
}

// A tiled tensor's plan is format 2 and says its tiles; its chunks are those of its tiles.
TEST(CodingPlan, TiledTensorsRoundTripInFormatTwo) {
  const std::string body = Checkpoint(0);
  const auto view = CheckpointView::Parse(Bytes(body));
  ASSERT_TRUE(view.ok());
  CodingPlan plan = PlanFor(*view, 1000, 5e-3, PlanBase{7, 12, ""});
  PlannedTensor& a = plan.tensors[0];  // F32 [64, 96]
  a.tile_counts = {1, 2};
  a.chunk_bytes = 64 * 48 * 4 / 2;
  a.chunk_count = 4;
  const std::string text = plan.ToJson();
  EXPECT_NE(text.find("\"format\":2"), std::string::npos);
  auto back = CodingPlan::FromJson(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, plan);
  EXPECT_EQ(a.ChunkLength(1), 64u * 48 * 4 / 2);
  // The second tile (columns 48..95) owns chunks 2 and 3; a box of both tiles, none (its
  // tiles are not runs of its bytes).
  EXPECT_EQ(a.ChunksInside(TensorBox{{0, 48}, {64, 48}}), (std::pair<uint32_t, uint32_t>{2, 4}));
  EXPECT_EQ(a.ChunksInside(TensorBox{{0, 0}, {64, 96}}), (std::pair<uint32_t, uint32_t>{0, 0}));
  EXPECT_EQ(a.ChunksInside(TensorBox{{0, 0}, {32, 96}}), (std::pair<uint32_t, uint32_t>{0, 0}));
}

TEST(EncodedBody, ParsesWhateverTheBodyIsCutInto) {
  const std::string raw_header = std::string("\x08\0\0\0\0\0\0\0{}      ", 16);
  std::string body = EncodePreamble({0x1234, 9, raw_header});
  const std::string record_a = "first record", record_b(70000, 'b');
  ChunkCodingInfo info;
  info.quantizer = 1;
  info.bound = 5e-3;
  info.exact_elements = 3;
  info.model_entropy_bits = 1234.5;
  body += EncodeChunkFrame({0, 0, info, record_a});
  body += EncodeChunkFrame({2, 5, {}, record_b});
  body += EncodeEnd({std::string(64, 'c'), std::string(64, 'd')});
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    Received got;
    EncodedBodyParser parser(&got, 1 << 20, 1 << 20);
    for (size_t at = 0; at < body.size();) {
      const size_t n = std::min<size_t>(body.size() - at, 1 + rng() % (trial < 10 ? 7 : 40000));
      ASSERT_TRUE(parser.Feed(Bytes(std::string_view(body).substr(at, n))).ok());
      at += n;
    }
    ASSERT_TRUE(parser.Finish().ok());
    EXPECT_EQ(parser.consumed(), body.size());
    EXPECT_EQ(got.preamble.plan_digest, 0x1234u);
    EXPECT_EQ(got.preamble.reference, 9u);
    EXPECT_EQ(got.preamble.raw_header, raw_header);
    ASSERT_EQ(got.records.size(), 2u);
    EXPECT_EQ(got.records[0], record_a);
    EXPECT_EQ(got.records[1], record_b);
    EXPECT_EQ(got.frames[0].info.bound, 5e-3);
    EXPECT_EQ(got.frames[0].info.model_entropy_bits, 1234.5);
    EXPECT_EQ(got.frames[0].info.exact_elements, 3u);
    EXPECT_EQ(got.frames[1].tensor, 2u);
    EXPECT_EQ(got.frames[1].chunk, 5u);
    EXPECT_EQ(got.end.pushed_sha256, std::string(64, 'c'));
    EXPECT_EQ(got.end.restored_sha256, std::string(64, 'd'));
  }
  // Every truncation is refused, and so is a byte more.
  for (size_t cut = 0; cut < body.size(); cut += (cut < 200 ? 1 : 997)) {
    Received got;
    EncodedBodyParser parser(&got, 1 << 20, 1 << 20);
    ASSERT_TRUE(parser.Feed(Bytes(std::string_view(body).substr(0, cut))).ok()) << cut;
    const Status s = parser.Finish();
    ASSERT_FALSE(s.ok()) << cut;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  }
  Received got;
  EncodedBodyParser parser(&got, 1 << 20, 1 << 20);
  EXPECT_FALSE(parser.Feed(Bytes(body + "x")).ok());
}

TEST(EncodedBody, RefusesBadFramingBeforeBufferingIt) {
  const std::string raw_header = std::string("\x08\0\0\0\0\0\0\0{}      ", 16);
  const std::string preamble = EncodePreamble({1, 0, raw_header});
  auto refused = [](const std::string& body, uint64_t max_record) {
    Received got;
    EncodedBodyParser parser(&got, 1 << 10, max_record);
    const Status s = parser.Feed(Bytes(body));
    return !s.ok() && s.code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused("NOTENC" + preamble.substr(6), 100));
  std::string newer = preamble;
  newer[7] = 2;
  EXPECT_TRUE(refused(newer, 100));
  EXPECT_TRUE(refused(EncodePreamble({1, 0, std::string(2000, ' ')}), 100));
  EXPECT_TRUE(refused(preamble + EncodeChunkFrame({0, 0, {}, std::string(101, 'r')}), 100));
  EXPECT_TRUE(refused(preamble + "\x07", 100));
  EXPECT_TRUE(refused(preamble + EncodeEnd({std::string(64, 'X'), std::string(64, 'd')}), 100));
}

// Decodes every chunk of an encoded body, as the daemon's restore would, into a restored body.
std::string Restore(const Encoded& e, const CodingPlan& plan, const CheckpointView& pushed,
                    const CheckpointView* reference) {
  Received got;
  EncodedBodyParser parser(&got, 1 << 20, 1 << 24);
  EXPECT_TRUE(parser.Feed(Bytes(e.body)).ok());
  EXPECT_TRUE(parser.Finish().ok());
  std::string out(pushed.raw_header());
  out.resize(pushed.byte_size());
  for (size_t k = 0; k < got.frames.size(); ++k) {
    const auto record = ChunkRecord::DecodeFrom(got.records[k]);
    EXPECT_TRUE(record.ok());
    if (!record.ok()) continue;
    const PlannedTensor& t = plan.tensors[got.frames[k].tensor];
    const uint64_t at = uint64_t{got.frames[k].chunk} * t.chunk_bytes;
    std::optional<std::span<const uint8_t>> ref;
    if (record->kind == FrameKind::kDelta) {
      ref = reference->TensorData(t.name)->subspan(at, record->raw_length);
    }
    auto codec = CodecForDecoding(record->codec_id);
    EXPECT_TRUE(codec.ok());
    std::vector<uint8_t> decoded(record->raw_length);
    EXPECT_TRUE((*codec)->Decode(t.dtype, Bytes(record->payload), ref, decoded).ok());
    EXPECT_EQ(Xxh3Checksum(decoded), record->raw_checksum);
    const TensorInfo& info = pushed.header().tensors[got.frames[k].tensor];
    std::copy(
        decoded.begin(), decoded.end(),
        out.begin() + static_cast<std::ptrdiff_t>(8 + pushed.header().json_size + info.begin + at));
  }
  return out;
}

TEST(EdgeEncoder, KeyframesDecodeToTheReconstructionItReturns) {
  const std::string body = Checkpoint(0);
  const auto view = CheckpointView::Parse(Bytes(body));
  ASSERT_TRUE(view.ok());
  for (double bound : {0.0, 5e-3}) {
    SCOPED_TRACE(bound == 0 ? "lossless" : "lossy");
    const CodingPlan plan = PlanFor(*view, 4096, bound, std::nullopt);
    const Encoded e = EncodeOrDie(plan, *view, nullptr);
    EXPECT_EQ(e.result.raw_bytes, body.size());
    EXPECT_EQ(e.result.encoded_bytes, e.body.size());
    EXPECT_EQ(e.result.pushed_sha256, testing::Sha256Hex(body));
    Sha256 restored;
    restored.Update(e.reconstruction);
    EXPECT_EQ(e.result.restored_sha256, restored.FinishHex());
    if (bound == 0) {
      EXPECT_EQ(std::string(e.reconstruction.begin(), e.reconstruction.end()), body);
      EXPECT_EQ(e.result.restored_sha256, e.result.pushed_sha256);
    } else {
      const std::string restored_body(e.reconstruction.begin(), e.reconstruction.end());
      EXPECT_EQ(testing::CheckWithinBound(body, restored_body, bound).error, "");
      EXPECT_LT(e.body.size(), body.size() / 2);
    }
    EXPECT_EQ(Restore(e, plan, *view, nullptr),
              std::string(e.reconstruction.begin(), e.reconstruction.end()));
    // The same bytes on one thread as on several.
    EXPECT_EQ(EncodeOrDie(plan, *view, nullptr, 1).body, e.body);
  }
}

TEST(EdgeEncoder, DeltasNeedTheBasesReconstruction) {
  const std::string first = Checkpoint(0), second = Checkpoint(1e-3);
  const auto v1 = CheckpointView::Parse(Bytes(first));
  const auto v2 = CheckpointView::Parse(Bytes(second));
  ASSERT_TRUE(v1.ok() && v2.ok());
  const Encoded keyframe = EncodeOrDie(PlanFor(*v1, 4096, 5e-3, std::nullopt), *v1, nullptr);
  const auto reference = CheckpointView::Parse(keyframe.reconstruction);
  ASSERT_TRUE(reference.ok());
  const CodingPlan plan = PlanFor(*v2, 4096, 5e-3, PlanBase{1, 1, keyframe.result.restored_sha256});
  const Encoded delta = EncodeOrDie(plan, *v2, &*reference);
  EXPECT_LT(delta.body.size(), keyframe.body.size());
  const std::string restored(delta.reconstruction.begin(), delta.reconstruction.end());
  EXPECT_EQ(testing::CheckWithinBound(second, restored, 5e-3).error, "");
  EXPECT_EQ(Restore(delta, plan, *v2, &*reference), restored);

  auto refuse = [&](const CheckpointView* ref, const CodingPlan& p) {
    return EncodeByPlan(p, *v2, ref, 1, [](std::string_view) { return Status::Ok(); })
        .status()
        .code();
  };
  // No reference, or one that is not the base's reconstruction.
  EXPECT_EQ(refuse(nullptr, plan), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refuse(&*v1, plan), StatusCode::kFailedPrecondition);
  // A plan of another checkpoint.
  CodingPlan other = plan;
  other.tensors[1].name = "c.bias";
  EXPECT_EQ(refuse(&*reference, other), StatusCode::kInvalidArgument);
  other = plan;
  other.tensors.pop_back();
  EXPECT_EQ(refuse(&*reference, other), StatusCode::kInvalidArgument);
}

// A checkpoint given as its header and each tensor's bytes where they lie (a program's tensors)
// codes to the same body as the same checkpoint in one piece; parts that do not make the body
// its header describes are refused.
TEST(EdgeEncoder, ACheckpointInPartsCodesAsInOnePiece) {
  const std::string body = Checkpoint(0);
  const auto whole = CheckpointView::Parse(Bytes(body));
  ASSERT_TRUE(whole.ok());
  // Each tensor copied apart, so that nothing of the parts lies where the body has it.
  std::vector<std::string> copies;
  std::vector<std::span<const uint8_t>> tensors;
  for (size_t i = 0; i < whole->header().tensors.size(); ++i) {
    const auto data = whole->TensorData(i);
    copies.emplace_back(data.begin(), data.end());
  }
  for (const std::string& c : copies) tensors.push_back(Bytes(c));
  const std::string header(whole->raw_header());
  const auto parts = CheckpointView::FromParts(Bytes(header), tensors);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ(parts->byte_size(), body.size());
  EXPECT_EQ(parts->Sha256Hex(), testing::Sha256Hex(body));
  const CodingPlan plan = PlanFor(*whole, 4096, 5e-3, std::nullopt);
  EXPECT_EQ(EncodeOrDie(plan, *parts, nullptr).body, EncodeOrDie(plan, *whole, nullptr).body);

  auto missing = tensors;
  missing.pop_back();
  EXPECT_EQ(CheckpointView::FromParts(Bytes(header), missing).status().code(),
            StatusCode::kInvalidArgument);
  auto short_one = tensors;
  short_one[0] = short_one[0].first(short_one[0].size() - 4);
  EXPECT_EQ(CheckpointView::FromParts(Bytes(header), short_one).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointView::FromParts(Bytes(header.substr(0, 12)), tensors).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
