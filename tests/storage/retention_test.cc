#include "ckpt/storage/retention.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace ckpt {
namespace {

RetentionPolicy Parse(std::string_view json) {
  auto p = RetentionPolicy::FromJson(json);
  EXPECT_TRUE(p.ok()) << json << ": " << p.status().ToString();
  return p.ok() ? *p : RetentionPolicy{};
}

// Versions 100, 200, ..., n*100, pushed one hour apart ending at `now`, 10 bytes each.
std::vector<RetentionCandidate> Versions(int n, int64_t now) {
  std::vector<RetentionCandidate> out;
  for (int i = 1; i <= n; ++i) {
    RetentionCandidate c;
    c.version = 100 * i;
    c.created_at_ms = now - int64_t{n - i} * 3'600'000;
    c.stored_bytes = 10;
    out.push_back(c);
  }
  return out;
}

std::set<uint64_t> Kept(const std::vector<RetentionDecision>& decisions) {
  std::set<uint64_t> kept;
  for (const auto& d : decisions) {
    if (d.keep) kept.insert(d.version);
  }
  return kept;
}

constexpr int64_t kNow = 1'800'000'000'000;

TEST(Retention, EmptyPolicyKeepsEverything) {
  auto decisions = Parse("{}").Evaluate(Versions(5, kNow), kNow);
  EXPECT_EQ(Kept(decisions).size(), 5u);
}

TEST(Retention, KeepLastKeepsTheNewest) {
  EXPECT_EQ(Kept(Parse(R"({"keep_last":2})").Evaluate(Versions(5, kNow), kNow)),
            (std::set<uint64_t>{400, 500}));
}

TEST(Retention, KeepEveryKeepsMultiplesAndTheLatest) {
  EXPECT_EQ(Kept(Parse(R"({"keep_every":200})").Evaluate(Versions(5, kNow), kNow)),
            (std::set<uint64_t>{200, 400, 500}));
}

TEST(Retention, KeepWithinKeepsRecentPushes) {
  // Pushed 4, 3, 2, 1, 0 hours ago.
  EXPECT_EQ(Kept(Parse(R"({"keep_within":"90m"})").Evaluate(Versions(5, kNow), kNow)),
            (std::set<uint64_t>{400, 500}));
}

TEST(Retention, KeepBestByMetricMinAndMaxIgnoringVersionsWithoutIt) {
  auto versions = Versions(6, kNow);
  const double loss[] = {5, 1, 4, 2, 3};  // version 600 has no metric
  for (int i = 0; i < 5; ++i) versions[i].metrics["loss"] = loss[i];
  EXPECT_EQ(Kept(Parse(R"({"keep_best":{"count":2,"metric":"loss"}})").Evaluate(versions, kNow)),
            (std::set<uint64_t>{200, 400, 600}));
  EXPECT_EQ(Kept(Parse(R"({"keep_best":{"count":1,"metric":"loss","mode":"max"}})")
                     .Evaluate(versions, kNow)),
            (std::set<uint64_t>{100, 600}));
}

TEST(Retention, MaxBytesDropsTheOldestUnprotectedFirst) {
  auto versions = Versions(6, kNow);
  versions[0].tags = {"release"};
  // 25 bytes: the tagged 100 and latest 600 use 20; room for one more, the newest: 500.
  EXPECT_EQ(Kept(Parse(R"({"max_bytes":35})").Evaluate(versions, kNow)),
            (std::set<uint64_t>{100, 500, 600}));
}

TEST(Retention, TagsAndLatestSurviveEveryRuleAndReasonsAreReported) {
  auto versions = Versions(8, kNow);
  versions[2].tags = {"release", "best"};
  auto decisions =
      Parse(R"({"keep_last":1,"keep_every":100000,"max_bytes":1})").Evaluate(versions, kNow);
  EXPECT_EQ(Kept(decisions), (std::set<uint64_t>{300, 800}));
  EXPECT_EQ(decisions[2].kept_by, (std::vector<std::string>{"tag:release", "tag:best"}));
  EXPECT_EQ(decisions[7].kept_by, (std::vector<std::string>{"latest", "keep_last"}));
  EXPECT_TRUE(decisions[0].kept_by.empty());
}

// The union property, on random policies and versions: a version is kept exactly when some rule
// keeps it on its own, and the latest and tagged versions always are.
TEST(Retention, UnionOfRulesOnRandomPolicies) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 200; ++round) {
    auto versions = Versions(1 + static_cast<int>(rng() % 30), kNow);
    for (auto& v : versions) {
      if (rng() % 5 == 0) v.tags = {"t" + std::to_string(v.version)};
      if (rng() % 2) v.metrics["acc"] = static_cast<double>(rng() % 100);
    }
    const std::string rules[] = {R"("keep_last":)" + std::to_string(1 + rng() % 5),
                                 R"("keep_every":)" + std::to_string(100 * (1 + rng() % 4)),
                                 R"("keep_within":")" + std::to_string(1 + rng() % 10) + "h\"",
                                 R"("keep_best":{"count":)" + std::to_string(1 + rng() % 3) +
                                     R"(,"metric":"acc","mode":"max"})"};
    std::string combined;
    std::set<uint64_t> expected;
    for (const std::string& rule : rules) {
      if (rng() % 2) continue;
      combined += (combined.empty() ? "" : ",") + rule;
      for (uint64_t v : Kept(Parse("{" + rule + "}").Evaluate(versions, kNow))) expected.insert(v);
    }
    if (combined.empty()) continue;
    EXPECT_EQ(Kept(Parse("{" + combined + "}").Evaluate(versions, kNow)), expected) << combined;
    EXPECT_TRUE(expected.count(versions.back().version));
    for (const auto& v : versions) {
      if (!v.tags.empty()) {
        EXPECT_TRUE(expected.count(v.version)) << combined;
      }
    }
  }
}

TEST(Retention, InvalidPoliciesNameTheField) {
  for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"keep_last":0})", "keep_last"},
           {R"({"keep_last":"3"})", "keep_last"},
           {R"({"keep_every":-5})", "keep_every"},
           {R"({"keep_within":"3 days"})", "keep_within"},
           {R"({"keep_within":"0h"})", "keep_within"},
           {R"({"keep_within":72})", "keep_within"},
           {R"({"keep_best":{"metric":"loss"}})", "keep_best.count"},
           {R"({"keep_best":{"count":2}})", "keep_best.metric"},
           {R"({"keep_best":{"count":2,"metric":"loss","mode":"lowest"}})", "keep_best.mode"},
           {R"({"max_bytes":1.5})", "max_bytes"},
           {R"({"keep_lats":3})", "keep_lats"},
           {R"({"tensor_rules":{}})", "tensor_rules"},
           {R"({"tensor_rules":[]})", "tensor_rules"},
           {R"({"tensor_rules":[{"tensors":"optim.*"}]})", "tensor_rules[0]"},
           {R"({"tensor_rules":[{"keep_last":2}]})", "tensor_rules[0].tensors"},
           {R"({"tensor_rules":[{"tensors":[],"keep_last":2}]})", "tensor_rules[0].tensors"},
           {R"({"tensor_rules":[{"tensors":[""],"keep_last":2}]})", "tensor_rules[0].tensors"},
           {R"({"tensor_rules":[{"tensors":"a","keep_last":0}]})", "tensor_rules[0].keep_last"},
           {R"({"tensor_rules":[{"tensors":"a","keep_within":"1y"}]})",
            "tensor_rules[0].keep_within"},
           {R"({"tensor_rules":[{"tensors":"a","keep_best":1}]})", "tensor_rules[0].keep_best"},
           {R"({"tensor_rules":[1]})", "tensor_rules[0]"}}) {
    auto p = RetentionPolicy::FromJson(json);
    ASSERT_FALSE(p.ok()) << json;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("'" + field + "'"), std::string::npos)
        << json << " -> " << p.status().message();
  }
  EXPECT_FALSE(RetentionPolicy::FromJson("[1]").ok());
  EXPECT_FALSE(RetentionPolicy::FromJson("{").ok());
}

TEST(Retention, JsonRoundTrips) {
  const auto p =
      Parse(R"({"keep_last":5,"keep_every":1000,"keep_within":"72h",)"
            R"("keep_best":{"count":3,"metric":"loss","mode":"min"},"max_bytes":1073741824})");
  EXPECT_EQ(*p.keep_within_ms, 72 * 3'600'000);
  EXPECT_EQ(Parse(p.ToJson()), p);
  EXPECT_EQ(Parse(R"({"keep_within":"14d"})").ToJson(), R"({"keep_within":"2w"})");
}

// Tensor rules drop their tensors from the kept versions they do not keep themselves; the
// latest and tagged versions keep every tensor, deleted versions get no tensor verdict, and the
// first rule whose globs match a tensor decides.
TEST(Retention, TensorRulesDropTensorsFromTheVersionsTheyDoNotKeep) {
  const auto p = Parse(R"({"keep_last":6,"tensor_rules":[
      {"tensors":["optim.*.exp_avg","optimizer.*"],"keep_last":2},
      {"tensors":"optim.*","keep_every":300}]})");
  EXPECT_FALSE(p.KeepsEverything());
  auto versions = Versions(8, kNow);  // 100 .. 800
  versions[3].tags = {"best"};        // 400
  const auto decisions = p.Evaluate(versions, kNow);
  EXPECT_EQ(Kept(decisions), (std::set<uint64_t>{300, 400, 500, 600, 700, 800}));
  std::map<uint64_t, std::vector<size_t>> dropping;
  for (const auto& d : decisions) dropping[d.version] = d.dropping_rules;
  EXPECT_TRUE(dropping[100].empty());                  // deleted: no tensor verdict
  EXPECT_EQ(dropping[300], (std::vector<size_t>{0}));  // a multiple of 300: rule 1 keeps it
  EXPECT_TRUE(dropping[400].empty());                  // tagged
  EXPECT_EQ(dropping[500], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(dropping[600], (std::vector<size_t>{0}));
  EXPECT_EQ(dropping[700], (std::vector<size_t>{1}));  // the newest two keep rule 0's tensors
  EXPECT_TRUE(dropping[800].empty());                  // the latest keeps every tensor
  const RetentionDecision* v500 = &decisions[4];
  ASSERT_EQ(v500->version, 500u);
  EXPECT_TRUE(p.DropsTensor(*v500, "optim.w.exp_avg"));
  EXPECT_TRUE(p.DropsTensor(*v500, "optimizer.state"));
  EXPECT_TRUE(p.DropsTensor(*v500, "optim.w.exp_avg_sq"));  // rule 1
  EXPECT_FALSE(p.DropsTensor(*v500, "model.w"));
  const RetentionDecision* v300 = &decisions[2];
  EXPECT_TRUE(p.DropsTensor(*v300, "optim.w.exp_avg"));
  // Rule 0's globs do not match it, rule 1 keeps 300.
  EXPECT_FALSE(p.DropsTensor(*v300, "optim.w.exp_avg_sq"));

  // Without version rules every version is kept, and tensor rules still apply.
  const auto only = Parse(R"({"tensor_rules":[{"tensors":"optim.*","keep_within":"150m"}]})");
  EXPECT_TRUE(only.KeepsEverything());
  const auto all = only.Evaluate(Versions(4, kNow), kNow);
  EXPECT_EQ(Kept(all).size(), 4u);
  EXPECT_EQ(all[0].dropping_rules, (std::vector<size_t>{0}));  // 3 h old
  EXPECT_EQ(all[1].dropping_rules, (std::vector<size_t>{}));   // 2 h old
  EXPECT_EQ(Parse(only.ToJson()), only);
  EXPECT_EQ(Parse(p.ToJson()), p);
}

TEST(Retention, DurationsParse) {
  EXPECT_EQ(*ParseDurationMs("90s"), 90'000);
  EXPECT_EQ(*ParseDurationMs("30m"), 1'800'000);
  EXPECT_EQ(*ParseDurationMs("7d"), 7 * 86'400'000LL);
  EXPECT_FALSE(ParseDurationMs("h").ok());
  EXPECT_FALSE(ParseDurationMs("-1h").ok());
  EXPECT_FALSE(ParseDurationMs("99999999999999999999h").ok());
}

}  // namespace
}  // namespace ckpt
