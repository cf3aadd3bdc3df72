#include "ckpt/storage/codec_policy.h"

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

// Lossy tensors are coded on the lattice (reclaimable) unless the policy opts out.
TEST(CodecPolicy, ReclaimableSelectsLatticeCoding) {
  const std::vector<uint64_t> matrix = {4, 4};
  auto p = CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":1e-3})", CodecPolicy{});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->reclaimable);
  EXPECT_TRUE(p->ForTensor("w", DType::kF32, matrix).lossy_options.reclaimable);
  auto off = CodecPolicy::FromJson(R"({"reclaimable":false})", *p);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->ForTensor("w", DType::kF32, matrix).lossy_options.reclaimable);
  auto again = CodecPolicy::FromJson(off->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *off);
}

// low_rank gives lattice codings of rank-2 tensors their column count (overrides included),
// nothing else; it round-trips through the JSON form.
TEST(CodecPolicy, LowRankGivesMatricesTheirColumns) {
  auto p = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_abs_error":1e-3,"low_rank":true,"lossless_tensors":[],
          "overrides":[{"tensors":"optim.*","max_abs_error":1e-2}]})",
      CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->low_rank);
  EXPECT_EQ(p->ForTensor("w", DType::kF32, {64, 48}).lossy_options.low_rank_columns, 48u);
  EXPECT_EQ(p->ForTensor("optim.w", DType::kF32, {64, 48}).lossy_options.low_rank_columns, 48u);
  EXPECT_EQ(p->ForTensor("b", DType::kF32, {64}).lossy_options.low_rank_columns, 0u);
  EXPECT_EQ(p->ForTensor("conv", DType::kF32, {8, 4, 3, 3}).lossy_options.low_rank_columns, 0u);
  auto again = CodecPolicy::FromJson(p->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *p);
  // On by default; off on request, and without the lattice.
  auto by_default =
      CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":1e-3})", CodecPolicy{});
  ASSERT_TRUE(by_default.ok());
  EXPECT_TRUE(by_default->low_rank);
  EXPECT_EQ(by_default->ForTensor("w", DType::kF32, {64, 48}).lossy_options.low_rank_columns, 48u);
  auto plain = CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":1e-3,"low_rank":false})",
                                     CodecPolicy{});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->low_rank);
  EXPECT_EQ(plain->ForTensor("w", DType::kF32, {64, 48}).lossy_options.low_rank_columns, 0u);
  auto additive = CodecPolicy::FromJson(R"({"reclaimable":false})", *p);
  ASSERT_TRUE(additive.ok());
  EXPECT_EQ(additive->ForTensor("w", DType::kF32, {64, 48}).lossy_options.low_rank_columns, 0u);
}

// fast_latest true codes on the plain lattice: no element history, no low-rank shift (whatever
// low_rank says), in overrides too; "auto" (the default) does so for a checkpoint larger than
// the reference cache keeps; every value round-trips through the JSON form.
TEST(CodecPolicy, FastLatestCodesOnThePlainLattice) {
  auto by_default = CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":1e-3})", {});
  ASSERT_TRUE(by_default.ok());
  EXPECT_FALSE(by_default->fast_latest.has_value());
  EXPECT_TRUE(by_default->ForTensor("w", DType::kF32, {64, 48}).lossy_options.history);
  EXPECT_EQ(by_default->ForTensor("w", DType::kF32, {64, 48}).lossy_options.low_rank_columns, 48u);
  const TensorCoding large =
      by_default->ForTensor("w", DType::kF32, {64, 48}, /*larger_than_cache=*/true);
  EXPECT_FALSE(large.lossy_options.history);
  EXPECT_EQ(large.lossy_options.low_rank_columns, 0u);
  auto p = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_abs_error":1e-3,"fast_latest":true,"lossless_tensors":[],
          "overrides":[{"tensors":"optim.*","max_abs_error":1e-2}]})",
      CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->fast_latest, true);
  EXPECT_TRUE(p->low_rank);
  for (const char* name : {"w", "optim.w"}) {
    const TensorCoding coding = p->ForTensor(name, DType::kF32, {64, 48});
    EXPECT_TRUE(coding.lossy) << name;
    EXPECT_FALSE(coding.lossy_options.history) << name;
    EXPECT_EQ(coding.lossy_options.low_rank_columns, 0u) << name;
    EXPECT_TRUE(coding.lossy_options.reclaimable) << name;
  }
  auto off = CodecPolicy::FromJson(R"({"fast_latest":false})", *by_default);
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->ForTensor("w", DType::kF32, {64, 48}, true).lossy_options.history);
  // An additive model has no lattice to reverse: "auto" leaves its coding alone.
  auto additive = CodecPolicy::FromJson(R"({"reclaimable":false})", *by_default);
  ASSERT_TRUE(additive.ok());
  EXPECT_EQ(additive->ForTensor("w", DType::kF32, {64, 48}, true),
            additive->ForTensor("w", DType::kF32, {64, 48}, false));
  for (const CodecPolicy& policy : {*by_default, *p, *off}) {
    auto again = CodecPolicy::FromJson(policy.ToJson(), CodecPolicy{});
    ASSERT_TRUE(again.ok()) << policy.ToJson();
    EXPECT_EQ(*again, policy) << policy.ToJson();
  }
  auto set_auto = CodecPolicy::FromJson(R"({"fast_latest":"auto"})", *p);
  ASSERT_TRUE(set_auto.ok());
  EXPECT_FALSE(set_auto->fast_latest.has_value());
}

// A bound on a lossless policy is stored (switching back to lossy uses it) but told, unless an
// override quantizes with it.
TEST(CodecPolicy, WarnsOfABoundThatNothingUses) {
  auto lossless = CodecPolicy::FromJson(R"({"max_abs_error":5e-3})", CodecPolicy{});
  ASSERT_TRUE(lossless.ok()) << lossless.status().ToString();
  ASSERT_EQ(lossless->Warnings().size(), 1u);
  EXPECT_NE(lossless->Warnings()[0].find("'max_abs_error' (0.005) does nothing"), std::string::npos)
      << lossless->Warnings()[0];
  auto used =
      CodecPolicy::FromJson(R"({"overrides":[{"tensors":"w*","lossless":false}]})", *lossless);
  ASSERT_TRUE(used.ok()) << used.status().ToString();
  EXPECT_TRUE(used->Warnings().empty());
  auto own_bound = CodecPolicy::FromJson(
      R"({"max_rel_error":1e-3,"overrides":[{"tensors":"w*","max_abs_error":1e-2}]})",
      CodecPolicy{});
  ASSERT_TRUE(own_bound.ok()) << own_bound.status().ToString();
  EXPECT_EQ(own_bound->Warnings().size(), 1u);
  auto lossy = CodecPolicy::FromJson(R"({"mode":"lossy"})", *lossless);
  ASSERT_TRUE(lossy.ok());
  EXPECT_TRUE(lossy->Warnings().empty());
  EXPECT_TRUE(CodecPolicy{}.Warnings().empty());
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
  for (
      const Case& c :
      {Case{R"({"keyframe_every":-1})", "keyframe_every"},
       Case{R"({"keyframe_every":"8"})", "keyframe_every"},
       Case{R"({"keyframe_every":100000})", "keyframe_every"},
       Case{R"({"mode":"zip"})", "mode"},
       Case{R"({"reclaimable":"yes"})", "reclaimable"},
       Case{R"({"low_rank":1})", "low_rank"},
       Case{R"({"fast_latest":"on"})", "fast_latest"},
       Case{R"({"mode":"lossy","max_abs_error":1e-3,"reclaimable":false,"fast_latest":true})",
            "fast_latest"},
       Case{R"({"colour":1})", "colour"},
       Case{R"([1])", "object"},
       Case{R"({)", "JSON"},
       Case{R"({"mode":"lossy"})", "max_abs_error"},
       Case{R"({"mode":"lossy","max_abs_error":0})", "max_abs_error"},
       Case{R"({"mode":"lossy","max_abs_error":-1})", "max_abs_error"},
       Case{R"({"mode":"lossy","max_abs_error":"1e-3"})", "max_abs_error"},
       Case{R"({"mode":"lossy","max_rel_error":2})", "max_rel_error"},
       Case{R"({"mode":"lossy","max_abs_error":1,"max_rel_error":0.1})", "not several"},
       Case{R"({"mode":"lossy","max_pointwise_rel_error":0.7})", "max_pointwise_rel_error"},
       Case{R"({"mode":"lossy","max_pointwise_rel_error":0})", "max_pointwise_rel_error"},
       Case{R"({"mode":"lossy","max_rel_error":0.1,"max_pointwise_rel_error":0.01})",
            "not several"},
       Case{R"({"mode":"lossy","max_pointwise_rel_error":0.01,"quantizer":"uniform"})",
            "quantizer"},
       Case{R"({"mode":"lossy","max_abs_error":1,"quantizer":"log"})", "quantizer"},
       Case{
           R"({"mode":"lossy","max_abs_error":1,"overrides":[{"tensors":"m","zero_below_mean":2}]})",
           "zero_below_mean"},
       Case{R"({"overrides":[{"tensors":"m","max_pointwise_rel_error":0.2,"zero_below_mean":0}]})",
            "zero_below_mean"},
       Case{
           R"({"overrides":[{"tensors":"m","max_pointwise_rel_error":0.2,"zero_below_mean":101}]})",
           "zero_below_mean"},
       Case{
           R"({"overrides":[{"tensors":"m","max_pointwise_rel_error":0.2,"zero_below_mean":"2"}]})",
           "zero_below_mean"},
       Case{R"({"overrides":[{"tensors":"m","lossless":true,"zero_below_mean":2}]})",
            "zero_below_mean"},
       Case{
           R"({"mode":"lossy","max_abs_error":1,"overrides":[{"tensors":"m*","quantizer":"log"}]})",
           "overrides[0].quantizer"},
       Case{R"({"mode":"lossy","max_abs_error":1,"quantizer":"magic"})", "quantizer"},
       Case{R"({"lossless_tensors":"*.bias"})", "lossless_tensors"},
       Case{R"({"lossless_tensors":[""]})", "lossless_tensors[0]"},
       Case{R"({"lossless_tensors":[3]})", "lossless_tensors[0]"},
       Case{R"({"overrides":{}})", "overrides"},
       Case{R"({"overrides":[{"max_abs_error":1}]})", "overrides[0].tensors"},
       Case{R"({"overrides":[{"tensors":"a*"}]})", "overrides[0]"},
       Case{R"({"overrides":[{"tensors":"a*","max_rel_error":7}]})", "overrides[0].max_rel_error"},
       Case{R"({"overrides":[{"tensors":"a*","lossless":true,"max_abs_error":1}]})",
            "overrides[0]"},
       Case{R"({"overrides":[{"tensors":"a*","quantizer":"uniform"}]})", "overrides[0]"},
       Case{R"({"overrides":[{"tensors":"a*","colour":1}]})", "overrides[0].colour"}}) {
    auto p = CodecPolicy::FromJson(c.json, CodecPolicy{});
    ASSERT_EQ(p.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(p.status().message().find(c.field), std::string::npos) << p.status().message();
  }
}

TEST(CodecPolicy, LossyFieldsRoundTrip) {
  auto p = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_rel_error":1e-3,"quantizer":"uniform","keyframe_every":0,
          "lossless_tensors":["*.bias","emb?"],
          "overrides":[{"tensors":"optim.*","max_abs_error":0.5},{"tensors":"x","lossless":true}]})",
      CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->mode, CodecMode::kLossy);
  EXPECT_EQ(p->bound, (ErrorBound{ErrorBound::Kind::kRelative, 1e-3}));
  EXPECT_EQ(p->EffectiveKeyframeEvery(), CodecPolicy::kLossyKeyframeEvery);
  ASSERT_EQ(p->overrides.size(), 2u);
  auto again = CodecPolicy::FromJson(p->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << p->ToJson();
  EXPECT_EQ(*again, *p);
  // Giving the other kind of bound replaces the base's bound.
  auto abs = CodecPolicy::FromJson(R"({"max_abs_error":0.25})", *p);
  ASSERT_TRUE(abs.ok());
  EXPECT_EQ(abs->bound, (ErrorBound{ErrorBound::Kind::kAbsolute, 0.25}));
}

TEST(CodecPolicy, DecidesPerTensorCoding) {
  auto p = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_abs_error":1e-3,
          "overrides":[{"tensors":"optim.*.exp_avg_sq","max_rel_error":0.01},
                       {"tensors":"keep.*","lossless":true}]})",
      CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<uint64_t> matrix = {4, 4}, vector = {4}, scalar = {};
  // Default rule: rank <= 1 and non-float tensors stay lossless.
  EXPECT_TRUE(p->ForTensor("w", DType::kF32, matrix).lossy);
  EXPECT_FALSE(p->ForTensor("b", DType::kF32, vector).lossy);
  EXPECT_FALSE(p->ForTensor("s", DType::kF32, scalar).lossy);
  EXPECT_FALSE(p->ForTensor("ids", DType::kI64, matrix).lossy);
  EXPECT_FALSE(p->ForTensor("f8", DType::kF8E4M3, matrix).lossy);
  EXPECT_EQ(p->ForTensor("w", DType::kBF16, matrix).lossy_options.bound.value, 1e-3);
  // Overrides come first, also for 1-D tensors.
  TensorCoding v = p->ForTensor("optim.layer.exp_avg_sq", DType::kF32, vector);
  EXPECT_TRUE(v.lossy);
  EXPECT_EQ(v.lossy_options.bound, (ErrorBound{ErrorBound::Kind::kRelative, 0.01}));
  EXPECT_FALSE(p->ForTensor("keep.w", DType::kF32, matrix).lossy);
  // An explicit list replaces the rank rule; [] quantizes every float tensor.
  auto all = CodecPolicy::FromJson(R"({"lossless_tensors":[]})", *p);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->ForTensor("b", DType::kF32, vector).lossy);
  auto bias = CodecPolicy::FromJson(R"({"lossless_tensors":["*.bias"]})", *p);
  ASSERT_TRUE(bias.ok());
  EXPECT_FALSE(bias->ForTensor("fc.bias", DType::kF32, matrix).lossy);
  EXPECT_TRUE(bias->ForTensor("fc.weight", DType::kF32, vector).lossy);
  // Lossless mode ignores the bound except in overrides.
  auto lossless = CodecPolicy::FromJson(R"({"mode":"lossless"})", *p);
  ASSERT_TRUE(lossless.ok());
  EXPECT_FALSE(lossless->ForTensor("w", DType::kF32, matrix).lossy);
  EXPECT_TRUE(lossless->ForTensor("optim.a.exp_avg_sq", DType::kF32, matrix).lossy);
}

TEST(CodecPolicy, PointwiseBoundsUseTheLogQuantizer) {
  auto p = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_abs_error":5e-3,
          "overrides":[{"tensors":"optim.*","max_pointwise_rel_error":0.01}]})",
      CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<uint64_t> matrix = {4, 4};
  TensorCoding moment = p->ForTensor("optim.w.exp_avg", DType::kF32, matrix);
  EXPECT_TRUE(moment.lossy);
  EXPECT_EQ(moment.lossy_options.bound, (ErrorBound{ErrorBound::Kind::kPointwise, 0.01}));
  EXPECT_EQ(moment.lossy_options.quantizer, Quantizer::kLog);
  EXPECT_EQ(p->ForTensor("w", DType::kF32, matrix).lossy_options.quantizer, Quantizer::kAuto);
  auto again = CodecPolicy::FromJson(p->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << p->ToJson();
  EXPECT_EQ(*again, *p);
  auto top = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_pointwise_rel_error":0.5,"quantizer":"log"})", CodecPolicy{});
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  EXPECT_EQ(top->ForTensor("w", DType::kF32, matrix).lossy_options.quantizer, Quantizer::kLog);
}

TEST(CodecPolicy, TheFullStatePresetSetsWeightsAndMomentsAndYieldsToTheDocument) {
  auto p = CodecPolicy::FromJson(R"({"preset":"full-state"})", CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<uint64_t> matrix = {4, 4}, vector = {4};
  EXPECT_EQ(p->mode, CodecMode::kLossy);
  const TensorCoding weight = p->ForTensor("model.w", DType::kF32, matrix);
  EXPECT_TRUE(weight.lossy);
  EXPECT_EQ(weight.lossy_options.bound, (ErrorBound{ErrorBound::Kind::kAbsolute, 5e-3}));
  EXPECT_TRUE(p->ForTensor("model.bias", DType::kF32, vector).lossy);  // every float tensor
  const TensorCoding m = p->ForTensor("optim.state.w.exp_avg", DType::kF32, matrix);
  EXPECT_TRUE(m.standalone);
  EXPECT_EQ(m.lossy_options.zero_below_mean, 3);
  EXPECT_EQ(m.lossy_options.bound.kind, ErrorBound::Kind::kPointwise);
  const TensorCoding v = p->ForTensor("optim.state.w.exp_avg_sq", DType::kF32, matrix);
  EXPECT_FALSE(v.standalone);
  EXPECT_EQ(v.lossy_options.bound, (ErrorBound{ErrorBound::Kind::kPointwise, 0.3}));
  // Stored expanded: GET returns what the preset set, and PUT of that is the same policy.
  auto again = CodecPolicy::FromJson(p->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *p);
  // The document's fields win: its bound, and its overrides before the preset's.
  auto tuned = CodecPolicy::FromJson(
      R"({"preset":"full-state","max_abs_error":1e-3,
          "overrides":[{"tensors":"*exp_avg_sq","max_pointwise_rel_error":0.1}]})",
      CodecPolicy{});
  ASSERT_TRUE(tuned.ok()) << tuned.status().ToString();
  EXPECT_EQ(tuned->ForTensor("model.w", DType::kF32, matrix).lossy_options.bound.value, 1e-3);
  EXPECT_EQ(tuned->ForTensor("a.exp_avg_sq", DType::kF32, matrix).lossy_options.bound.value, 0.1);
  EXPECT_TRUE(tuned->ForTensor("a.exp_avg", DType::kF32, matrix).standalone);
  for (const char* bad : {R"({"preset":"fast"})", R"({"preset":1})"}) {
    auto r = CodecPolicy::FromJson(bad, CodecPolicy{});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("preset"), std::string::npos) << r.status().ToString();
  }
}

TEST(CodecPolicy, TheDropRuleCodesItsTensorsStandalone) {
  auto p = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_abs_error":5e-3,
          "overrides":[{"tensors":"optim.*.exp_avg","max_pointwise_rel_error":0.25,
                        "zero_below_mean":2},
                       {"tensors":"optim.*.exp_avg_sq","max_pointwise_rel_error":0.1}]})",
      CodecPolicy{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<uint64_t> matrix = {4, 4};
  const TensorCoding first = p->ForTensor("optim.w.exp_avg", DType::kF32, matrix);
  EXPECT_TRUE(first.lossy);
  EXPECT_TRUE(first.standalone);
  EXPECT_EQ(first.lossy_options.zero_below_mean, 2);
  EXPECT_EQ(first.lossy_options.quantizer, Quantizer::kLog);
  const TensorCoding second = p->ForTensor("optim.w.exp_avg_sq", DType::kF32, matrix);
  EXPECT_FALSE(second.standalone);
  EXPECT_EQ(second.lossy_options.zero_below_mean, 0);
  EXPECT_FALSE(p->ForTensor("w", DType::kF32, matrix).standalone);
  auto again = CodecPolicy::FromJson(p->ToJson(), CodecPolicy{});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << p->ToJson();
  EXPECT_EQ(*again, *p);
  // The policy's own pointwise bound serves an override that only sets the rule.
  auto inherited = CodecPolicy::FromJson(
      R"({"mode":"lossy","max_pointwise_rel_error":0.1,
          "overrides":[{"tensors":"m","zero_below_mean":1}]})",
      CodecPolicy{});
  ASSERT_TRUE(inherited.ok()) << inherited.status().ToString();
  EXPECT_TRUE(inherited->ForTensor("m", DType::kF32, matrix).standalone);
}

}  // namespace
}  // namespace ckpt
