#include "ckpt/base/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_support.h"

namespace ckpt {
namespace {

using testing::OwnedTensor;
using testing::Serialize;

// Builds a body from a raw JSON header and `data_size` bytes of data.
std::string BodyWithHeader(std::string_view json, size_t data_size) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  out += json;
  out.append(data_size, '\x11');
  return out;
}

// Records everything the parser emits.
class RecordingSink : public SafetensorsSink {
 public:
  Status OnHeader(const SafetensorsHeader& header, std::string_view raw) override {
    header_ = header;
    raw_header_ = std::string(raw);
    data_.resize(header.tensors.size());
    return Status::Ok();
  }
  Status OnTensorData(size_t index, std::span<const uint8_t> bytes) override {
    if (index != ended_) return Status::Internal("data for tensor out of order");
    data_[index].append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return Status::Ok();
  }
  Status OnTensorEnd(size_t index) override {
    if (index != ended_) return Status::Internal("tensor ended out of order");
    ++ended_;
    return Status::Ok();
  }
  SafetensorsHeader header_;
  std::string raw_header_;
  std::vector<std::string> data_;
  size_t ended_ = 0;
};

Status ParseWhole(std::string_view body, std::optional<uint64_t> size, RecordingSink* sink) {
  SafetensorsStreamParser parser(sink, size);
  CKPT_RETURN_IF_ERROR(parser.Feed(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), body.size())));
  return parser.Finish();
}

Status ParseBody(std::string_view body) {
  RecordingSink sink;
  return ParseWhole(body, body.size(), &sink);
}

std::vector<OwnedTensor> SampleTensors() {
  return {
      {"a", DType::kF32, {2, 3}, std::string(24, '\1')},
      {"b", DType::kBF16, {4}, std::string(8, '\2')},
      {"scalar", DType::kI64, {}, std::string(8, '\3')},
      {"empty", DType::kF16, {0}, ""},
      {"mask", DType::kBool, {3}, std::string("\1\0\1", 3)},
  };
}

TEST(SafetensorsParser, ParsesValidFileAndEmitsTensorsInOffsetOrder) {
  auto tensors = SampleTensors();
  std::string body = Serialize(tensors, {{"format", "pt"}});
  RecordingSink sink;
  ASSERT_TRUE(ParseWhole(body, body.size(), &sink).ok());
  EXPECT_EQ(sink.header_.tensors.size(), tensors.size());
  EXPECT_EQ(sink.header_.metadata.at("format"), "pt");
  EXPECT_EQ(sink.header_.total_size(), body.size());
  EXPECT_EQ(sink.ended_, tensors.size());
  EXPECT_EQ(sink.raw_header_, body.substr(0, 8 + sink.header_.json_size));
  for (size_t i = 0; i < sink.header_.tensors.size(); ++i) {
    const auto& info = sink.header_.tensors[i];
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const OwnedTensor& t) { return t.name == info.name; });
    ASSERT_NE(it, tensors.end());
    EXPECT_EQ(sink.data_[i], it->bytes) << info.name;
    EXPECT_EQ(info.dtype, it->dtype);
    EXPECT_EQ(info.shape, it->shape);
  }
}

TEST(SafetensorsParser, ByteAtATimeFeedingEqualsWholeFeeding) {
  std::string body = Serialize(SampleTensors());
  RecordingSink whole, piecewise;
  ASSERT_TRUE(ParseWhole(body, body.size(), &whole).ok());
  SafetensorsStreamParser parser(&piecewise, std::nullopt);
  for (char c : body) {
    uint8_t b = static_cast<uint8_t>(c);
    ASSERT_TRUE(parser.Feed(std::span<const uint8_t>(&b, 1)).ok());
  }
  ASSERT_TRUE(parser.Finish().ok());
  EXPECT_EQ(whole.data_, piecewise.data_);
}

TEST(SafetensorsParser, AcceptsAllSpecDtypes) {
  std::vector<OwnedTensor> tensors;
  for (const char* name : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32",
                           "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}) {
    DType d = *DTypeFromName(name);
    tensors.push_back({name, d, {3}, std::string(3 * DTypeSize(d), '\5')});
  }
  EXPECT_TRUE(ParseBody(Serialize(tensors)).ok());
}

void ExpectRejected(std::string_view body, std::string_view message_part) {
  Status s = ParseBody(body);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(message_part), std::string::npos) << s.message();
}

TEST(SafetensorsParser, RejectsHeaderOver100MB) {
  std::string body(8, '\0');
  uint64_t n = 100'000'001;
  std::memcpy(body.data(), &n, 8);
  RecordingSink sink;
  SafetensorsStreamParser parser(&sink, std::nullopt);
  Status s =
      parser.Feed(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), 8));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds the limit"), std::string::npos) << s.message();
}

TEST(SafetensorsParser, RejectsHeaderLargerThanBody) {
  std::string body = BodyWithHeader("{}", 0);
  uint64_t n = 1000;
  std::memcpy(body.data(), &n, 8);
  ExpectRejected(body, "larger than the body");
}

TEST(SafetensorsParser, RejectsInvalidJson) {
  ExpectRejected(BodyWithHeader("{\"a\": [1, 2", 0), "invalid header JSON");
}

TEST(SafetensorsParser, RejectsHeaderNotStartingWithBrace) {
  ExpectRejected(BodyWithHeader(" {}", 0), "must start with '{'");
}

TEST(SafetensorsParser, RejectsUnknownDtype) {
  ExpectRejected(BodyWithHeader(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
                 "unknown dtype 'F128'");
}

TEST(SafetensorsParser, RejectsShapeNotMatchingOffsets) {
  ExpectRejected(BodyWithHeader(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
                 "need 16 bytes but data_offsets span 12");
}

TEST(SafetensorsParser, RejectsOverlappingOffsets) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                                6),
                 "overlaps");
}

TEST(SafetensorsParser, RejectsHoles) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                                10),
                 "hole in data buffer");
}

TEST(SafetensorsParser, RejectsOffsetsPastTheEnd) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4),
                 "runs past the end");
}

TEST(SafetensorsParser, RejectsTrailingBytes) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 9),
                 "trailing bytes");
}

TEST(SafetensorsParser, RejectsDuplicateNames) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                8),
                 "duplicate key 'a'");
}

TEST(SafetensorsParser, RejectsDuplicateKeysInsideAnEntryButNotAcrossEntries) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[4],"dtype":"F32",)"
                                R"("data_offsets":[0,4]}})",
                                4),
                 "duplicate key 'dtype'");
  const Status same_keys_in_two_entries =
      ParseBody(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                               R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                               8));
  EXPECT_TRUE(same_keys_in_two_entries.ok()) << same_keys_in_two_entries.ToString();
}

TEST(SafetensorsParser, RejectsNonStringMetadata) {
  ExpectRejected(BodyWithHeader(R"({"__metadata__":{"step":12}})", 0), "is not a string");
  ExpectRejected(BodyWithHeader(R"({"__metadata__":{"nested":{"a":"b"}}})", 0), "is not a string");
}

TEST(SafetensorsParser, RejectsNegativeAndOverflowingShapes) {
  ExpectRejected(BodyWithHeader(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
                 "non-negative integer");
  ExpectRejected(
      BodyWithHeader(
          R"({"a":{"dtype":"F64","shape":[281474976710655,281474976710655],"data_offsets":[0,0]}})",
          0),
      "overflows");
}

TEST(SafetensorsParser, RejectsTruncatedBodies) {
  std::string body = Serialize(SampleTensors());
  for (size_t cut : {size_t{3}, size_t{20}, body.size() - 1}) {
    RecordingSink sink;
    Status s = ParseWhole(body.substr(0, cut), std::nullopt, &sink);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << cut;
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  }
}

TEST(SafetensorsParser, RandomMutationsNeverCrash) {
  std::string valid = Serialize(SampleTensors(), {{"k", "v"}});
  std::mt19937_64 rng(42);
  int accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string body = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:
          body[rng() % body.size()] = static_cast<char>(rng());
          break;
        case 1:
          body.resize(rng() % (body.size() + 1));
          break;
        case 2:
          body.insert(rng() % (body.size() + 1), 1, static_cast<char>(rng()));
          break;
        default:
          if (body.size() > 8) body[rng() % 8] = static_cast<char>(rng());
      }
      if (body.empty()) body = "x";
    }
    RecordingSink sink;
    Status s =
        ParseWhole(body, (rng() % 2) ? std::optional<uint64_t>(body.size()) : std::nullopt, &sink);
    if (s.ok()) ++accepted;
  }
  EXPECT_LT(accepted, 5000);  // the mutations must actually hit validation
}

TEST(SafetensorsWriter, PadsHeaderToEightBytes) {
  std::string body = Serialize(SampleTensors());
  uint64_t n = 0;
  std::memcpy(&n, body.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

}  // namespace
}  // namespace ckpt
