#include "ckpt/base/model_name.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckpt {
namespace {

TEST(ModelName, ParseKeepsAValidNameAsItIs) {
  for (const std::string& name :
       std::vector<std::string>{"a", "llama-7b", "run_3.v2", "0", std::string(128, 'x')}) {
    auto parsed = ModelName::Parse(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
    EXPECT_EQ(parsed->str(), name);
    EXPECT_EQ(std::string_view(*parsed), name);
  }
}

TEST(ModelName, ParseRefusesWhatTheRuleDoesNot) {
  for (const std::string& name : std::vector<std::string>{
           "", std::string(129, 'x'), "-lead", ".hidden", "a/b", "a b", "bad!name", "é"}) {
    auto parsed = ModelName::Parse(name);
    ASSERT_FALSE(parsed.ok()) << "'" << name << "' was taken";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("[A-Za-z0-9][A-Za-z0-9._-]{0,127}"), std::string::npos)
        << parsed.status().ToString();
  }
}

}  // namespace
}  // namespace ckpt
