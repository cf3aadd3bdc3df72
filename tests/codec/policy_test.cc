#include "ckpt/codec/policy.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(CodecPolicy, ParsesAndRoundTrips) {
  auto p = CodecPolicy::FromJson(R"({"mode":"lossless","keyframe_every":4})", CodecPolicy{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->keyframe_every, 4u);
  auto again = CodecPolicy::FromJson(p->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *p);
}

TEST(CodecPolicy, MissingFieldsKeepBaseValues) {
  CodecPolicy base;
  base.keyframe_every = 9;
  auto p = CodecPolicy::FromJson(R"({"mode":"lossless"})", base);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->keyframe_every, 9u);
}

TEST(CodecPolicy, RejectsBadFieldsNamingThem) {
  struct Case {
    const char* json;
    const char* field;
  };
  for (const Case& c :
       {Case{R"({"keyframe_every":0})", "keyframe_every"},
        Case{R"({"keyframe_every":"8"})", "keyframe_every"},
        Case{R"({"keyframe_every":100000})", "keyframe_every"}, Case{R"({"mode":"zip"})", "mode"},
        Case{R"({"colour":1})", "colour"}, Case{R"([1])", "object"}, Case{R"({)", "JSON"}}) {
    auto p = CodecPolicy::FromJson(c.json, CodecPolicy{});
    ASSERT_EQ(p.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(p.status().message().find(c.field), std::string::npos) << p.status().message();
  }
}

}  // namespace
}  // namespace ckpt
