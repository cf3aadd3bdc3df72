// The encoded-push fuzz harness's scenario, shared with fuzz_make_seeds: a store whose model
// holds one lossy version pushed encoded, and the next checkpoint's plan and encoded body (what a
// client would send). Deterministic: the same plan and body on every run.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "ckpt/storage/checkpoint_store.h"
#include "fuzz_support.h"

namespace ckpt::fuzz {

// Version `step` of a small checkpoint: a matrix over several chunks, a bias, an integer tensor.
inline std::string ScenarioCheckpoint(int step) {
  std::vector<float> weights(700), bias(9);
  for (size_t i = 0; i < weights.size(); ++i) {
    weights[i] = 0.01f * static_cast<float>((i * 7919) % 101) + 0.001f * static_cast<float>(step);
  }
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * static_cast<float>(step + i);
  const int64_t steps = step;
  auto bytes = [](const auto& v) {
    return std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
  };
  return *WriteSafetensors(
      {{"layer.weight", DType::kF32, {70, 10}, bytes(weights)},
       {"layer.bias", DType::kF32, {9}, bytes(bias)},
       {"steps", DType::kI64, {1}, std::string_view(reinterpret_cast<const char*>(&steps), 8)}});
}

inline std::span<const uint8_t> AsSpan(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Opens a store in `dir` (chunks of 1 KiB) and pushes version 1 of model `model` encoded.
// Returns the restored body of version 1 (the client's reference) through `reference`.
inline std::unique_ptr<CheckpointStore> OpenScenarioStore(const std::string& dir) {
  StoreOptions options;
  options.data_dir = dir;
  options.chunk_bytes = 1024;
  options.sync_commits = false;
  options.min_free_bytes = 0;
  auto store = CheckpointStore::Open(options);
  CheckStatusIn(store.status(), {}, "opening the store");
  return std::move(store).value();
}

// Encodes `checkpoint` as version `version` of `model` by the store's plan, against `reference`
// (a restored body; empty: none). The restored body lands in `reconstruction`.
inline std::string EncodeForStore(CheckpointStore& store, const std::string& model,
                                  uint64_t version, const std::string& checkpoint,
                                  const std::vector<uint8_t>& reference,
                                  std::vector<uint8_t>* reconstruction) {
  auto view = CheckpointView::Parse(AsSpan(checkpoint));
  CheckStatusIn(view.status(), {}, "parsing the scenario's checkpoint");
  auto plan = store.PlanPush(model, version, std::string(view->raw_header()));
  CheckStatusIn(plan.status(), {}, "planning the scenario's push");
  std::optional<CheckpointView> held;
  if (!reference.empty()) held = CheckpointView::Parse(reference).value();
  std::string body;
  auto coded = EncodeByPlan(
      *plan, *view, held ? &*held : nullptr, 1,
      [&](std::string_view piece) {
        body.append(piece);
        return Status::Ok();
      },
      reconstruction ? CollectInto(reconstruction) : RestoredSink());
  CheckStatusIn(coded.status(), {}, "encoding the scenario's push");
  return body;
}

// Seeds `model` with a lossy policy and version 1 pushed encoded; returns version 1's restored
// body.
inline std::vector<uint8_t> SeedScenarioModel(CheckpointStore& store, const std::string& model) {
  auto lossy = CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":0.01})", CodecPolicy());
  Check(lossy.ok() && store.SetPolicy(model, *lossy).ok(), "seeding a policy");
  std::vector<uint8_t> reconstruction;
  const std::string body =
      EncodeForStore(store, model, 1, ScenarioCheckpoint(1), {}, &reconstruction);
  PushOptions options;
  options.body_format = PushBodyFormat::kEncoded;
  auto push = store.BeginPush(model, 1, body.size(), options);
  CheckStatusIn(push.status(), {}, "seeding: BeginPush");
  CheckStatusIn((*push)->Write(AsSpan(body)), {}, "seeding: Write");
  CheckStatusIn((*push)->Commit().status(), {}, "seeding: Commit");
  return reconstruction;
}

// Shard `shard` (0 or 1) of 2 cut from `checkpoint` (a body of the scenario's checkpoint, pushed
// or restored): the matrix's rows split in halves, the bias on both, the integer tensor on
// shard 1.
inline std::string ScenarioShardOf(std::span<const uint8_t> checkpoint, int shard) {
  auto view = CheckpointView::Parse(checkpoint).value();
  auto data = [&](size_t i) {
    const auto d = view.TensorData(i);
    return std::string_view(reinterpret_cast<const char*>(d.data()), d.size());
  };
  const uint64_t half = 35 * 10 * 4;
  std::vector<TensorSpec> tensors = {
      {"layer.weight", DType::kF32, {35, 10}, data(0).substr(shard * half, half)},
      {"layer.bias", DType::kF32, {9}, data(1)}};
  if (shard == 1) tensors.push_back({"steps", DType::kI64, {1}, data(2)});
  const std::string slices = R"({"layer.weight": {"global_shape": [70, 10], "offsets": [)" +
                             std::to_string(35 * shard) + ", 0]}}";
  return *WriteSafetensors(tensors, {{"ckptd.slices", slices}});
}

// Encodes shard `shard` of 2 of version `version` by the store's plan of it, against `reference`
// (the rank's part of the base).
inline std::string EncodeShardForStore(CheckpointStore& store, const std::string& model,
                                       uint64_t version, int shard, const std::string& body,
                                       const std::string& reference) {
  auto view = CheckpointView::Parse(AsSpan(body));
  CheckStatusIn(view.status(), {}, "parsing the scenario's shard");
  auto plan = store.PlanShard(model, version, shard, 2, std::string(view->raw_header()));
  CheckStatusIn(plan.status(), {}, "planning the scenario's shard");
  auto held = CheckpointView::Parse(AsSpan(reference));
  CheckStatusIn(held.status(), {}, "parsing the rank's part");
  std::string out;
  auto coded = EncodeByPlan(*plan, *view, &*held, 1, [&](std::string_view piece) {
    out.append(piece);
    return Status::Ok();
  });
  CheckStatusIn(coded.status(), {}, "encoding the scenario's shard");
  return out;
}

}  // namespace ckpt::fuzz
