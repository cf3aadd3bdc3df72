// Client::PushShardEncoded: one shard of a sharded version coded on the client by the server's
// plan of that shard, against this machine's reconstruction of the same shard of the base
// (docs/api.md, "Sharded versions" and "plan").
#include "encoded_shard_push.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>

#include "ckpt/base/tensor_slices.h"
#include "ckpt/client/client.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "encoded_part_pull.h"
#include "encoding_stream.h"
#include "held_reference.h"
#include "put_stream.h"
#include "query_strings.h"

namespace ckpt {
namespace {

// The tensors whose owned chunks the plan codes as deltas: what the reference must hold, each
// at the plan's slice.
std::vector<const PlannedTensor*> DeltaSlices(const CodingPlan& plan) {
  std::vector<const PlannedTensor*> wanted;
  for (const PlannedTensor& t : plan.tensors) {
    if (t.kind == FrameKind::kDelta && t.slice && t.slice->owned_begin < t.slice->owned_end) {
      wanted.push_back(&t);
    }
  }
  return wanted;
}

// Whether `reference` holds each of `wanted` at its slice (its shape, and its offsets as the
// file declares them).
bool HoldsSlices(const CheckpointView& reference, const std::vector<const PlannedTensor*>& wanted) {
  auto declared = ParseSliceDeclarations(reference.header().metadata);
  if (!declared.ok()) return false;
  for (const PlannedTensor* t : wanted) {
    const TensorInfo* held = nullptr;
    for (const TensorInfo& h : reference.header().tensors) {
      if (h.name == t->name) held = &h;
    }
    if (held == nullptr || held->shape != t->slice->box.shape) return false;
    const auto it = declared->find(t->name);
    const std::vector<uint64_t> offsets =
        it == declared->end() ? std::vector<uint64_t>(t->shape.size(), 0) : it->second.offsets;
    if (offsets != t->slice->box.offsets) return false;
  }
  return true;
}

// A reference file mapped and parsed.
struct MappedReference {
  MappedFile file;
  CheckpointView view;
};

// Maps `path` into `reference` (left empty when it is not a safetensors file).
void MapReference(const std::string& path, std::optional<MappedReference>* reference) {
  reference->reset();
  auto file = MappedFile::Open(path);
  if (!file.ok()) return;
  auto view = CheckpointView::Parse(file->bytes());
  if (!view.ok()) return;
  reference->emplace(MappedReference{std::move(file).value(), std::move(view).value()});
}

// Sends `shard` as the shard at `target` for the server to code; `why` it was not coded here.
Status PutPlainShard(const std::vector<ServerEndpoint>& servers, const ClientOptions& options,
                     TlsContext* tls, const std::string& target, const ShardInput& shard,
                     const std::string& why, ShardCoding* coding) {
  PutBody body = shard.plain_body();
  const uint64_t size = body.size.value_or(0);
  auto answer = StreamPut(servers, options, tls, target, std::move(body));
  // SHARDS_DROPPED: this shard is stored all the same.
  if (!answer.ok() && answer.status().subcode() != StatusSubcode::kShardsDropped) {
    return answer.status();
  }
  *coding = ShardCoding{answer.ok() ? answer->body : nlohmann::json::object(), false, size, "",
                        why + ": the server coded this shard"};
  return answer.ok() ? Status::Ok() : answer.status();
}

// Errors of an encoded pull of a part that mean only that no part can be had that way.
bool PartUnavailable(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kDataLoss ||
         s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kInvalidArgument;
}

}  // namespace

std::string ShardReferenceName(std::string_view model, uint32_t index, uint32_t count) {
  return std::string(model) + ".rank" + std::to_string(index) + "-of-" + std::to_string(count);
}

size_t ForgetOtherRankCounts(const std::string& dir, std::string_view model, uint32_t count) {
  // Names of the form MODEL.rankI-of-M, from their references and sidecars.
  const std::string prefix = std::string(model) + ".rank";
  std::set<std::string> stale;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with(prefix)) continue;
    const size_t dot = file.rfind('.');
    if (dot == std::string::npos || dot < prefix.size()) continue;
    const std::string_view extension = std::string_view(file).substr(dot);
    if (extension != ".safetensors" && extension != ".json") continue;
    const std::string name = file.substr(0, dot);
    uint32_t index = 0, of = 0;
    int used = 0;
    const std::string ranks = name.substr(prefix.size());
    if (std::sscanf(ranks.c_str(), "%u-of-%u%n", &index, &of, &used) != 2 ||
        static_cast<size_t>(used) != ranks.size() || ShardReferenceName(model, index, of) != name ||
        of == count) {
      continue;
    }
    stale.insert(name);
  }
  size_t removed = 0;
  for (const std::string& name : stale) {
    auto lock = ReferenceLock::TryAcquire(dir, name);
    if (!lock.ok() || !lock->has_value()) continue;
    const HeldReference held = HeldReferenceOf(dir, name);
    if (!ForgetSidecar(held).ok()) continue;
    std::filesystem::remove(held.path, ec);
    ++removed;
  }
  return removed;
}

Status Client::PushShardEncoded(std::string_view model, uint64_t version, uint32_t index,
                                uint32_t count, const ShardInput& shard,
                                const EncodedPushOptions& encoded, const std::string& query,
                                const ClientOptions& options, ShardCoding* coding) {
  std::optional<ReferenceLock> lock;
  if (!encoded.reference_dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(
        ReferenceLock claimed,
        ReferenceLock::Acquire(encoded.reference_dir, ShardReferenceName(model, index, count)));
    lock.emplace(std::move(claimed));
  }
  std::string why;
  bool use_held = true;
  for (int replans = 0; replans <= encoded.replans; ++replans) {
    const Status sent = PushShardEncodedOnce(model, version, index, count, shard, encoded, query,
                                             options, use_held, coding);
    if (sent.ok()) return sent;
    if (sent.code() == StatusCode::kInvalidArgument && use_held && !encoded.reference_dir.empty()) {
      // The server refused what was coded against the part held (it does not restore to what
      // the server holds: a part kept from a shard that a commit dropped and the server then
      // coded itself, or a damaged file): the part is forgotten and pulled.
      (void)ForgetSidecar(
          HeldReferenceOf(encoded.reference_dir, ShardReferenceName(model, index, count)));
      use_held = false;
      why = sent.message();
      continue;
    }
    if (sent.subcode() != StatusSubcode::kStalePlan) return sent;
    // Planned again: the model moved on, or the commit dropped this shard as coded against a
    // part the server does not hold; the part is pulled.
    use_held = false;
    why = sent.message();
  }
  // The model keeps moving on: the server codes this shard.
  return PutPlainShard(
      endpoints_, options, tls_.get(),
      VersionTarget(model, std::to_string(version)) + "/shards/" + std::to_string(index) + query,
      shard, "no current plan (" + why + ")", coding);
}

Status Client::PushShardEncodedOnce(std::string_view model, uint64_t version, uint32_t index,
                                    uint32_t count, const ShardInput& shard,
                                    const EncodedPushOptions& encoded, const std::string& query,
                                    const ClientOptions& options, bool use_held,
                                    ShardCoding* coding) {
  const std::string shard_target =
      VersionTarget(model, std::to_string(version)) + "/shards/" + std::to_string(index);
  const auto plain = [&](const std::string& why) {
    return PutPlainShard(endpoints_, options, tls_.get(), shard_target + query, shard, why, coding);
  };
  const CheckpointView& checkpoint = shard.view;
  auto plan_json = PostForJson(endpoints_, options, tls_.get(),
                               shard_target + "/plan?of=" + std::to_string(count),
                               checkpoint.raw_header(), "application/octet-stream");
  if (!plan_json.ok()) {
    // The version is committed (the shard is then compared with the one committed), or not
    // above the latest: no plan, the server answers the shard as a plain one.
    if (plan_json.status().code() == StatusCode::kFailedPrecondition &&
        plan_json.status().subcode() != StatusSubcode::kStalePlan) {
      return plain("no plan");
    }
    return plan_json.status();
  }
  CKPT_ASSIGN_OR_RETURN(CodingPlan plan, CodingPlan::FromJson(plan_json->dump()));

  const int threads = CodecThreads(encoded.threads);
  const std::string name = ShardReferenceName(model, index, count);
  const std::string& dir = encoded.reference_dir;
  // A base of `count` shards: parts kept for other rank counts are of older versions.
  if (!dir.empty() && plan.shard && plan.shard->base_shard_sha256.size() == count) {
    ForgetOtherRankCounts(dir, model, count);
  }
  // Without a reference directory, a part that must be pulled goes to a private temporary one.
  CKPT_ASSIGN_OR_RETURN(const ScratchDir scratch, ScratchDir::Make());
  const HeldReference held = HeldReferenceOf(dir.empty() ? scratch.path() : dir, name);
  std::optional<MappedReference> reference;
  std::string source;
  const std::vector<const PlannedTensor*> wanted = DeltaSlices(plan);
  if (!wanted.empty()) {
    // The rank's part of the base: the one it pushed as this very shard of the base, or pulled.
    const std::vector<std::string>& pushed = plan.shard->base_shard_sha256;
    const bool held_is_base = use_held && !dir.empty() && held.version == plan.base->version &&
                              !held.restored_sha256.empty() &&
                              ((pushed.size() == count && pushed[index] == held.restored_sha256) ||
                               held.restored_sha256 == plan.base->restored_sha256);
    if (held_is_base) {
      MapReference(held.path, &reference);
      if (reference && HoldsSlices(reference->view, wanted)) {
        source = "held";
      } else {
        reference.reset();
      }
    }
    if (!reference) {
      // This rank's part of the base as the server cuts it for `index` of `count`.
      const std::string part = scratch.path() + "/part.safetensors";
      PullOptions rank_part;
      rank_part.rank = index;
      rank_part.ranks = count;
      ClientOptions quiet = options;
      quiet.progress = nullptr;  // the progress reported is the shard's upload
      auto pulled = PullEncodedPart(
          endpoints_, quiet, tls_.get(),
          VersionTarget(model, std::to_string(plan.base->version)) + PullQuery(rank_part), part,
          threads);
      if (!pulled.ok() && !PartUnavailable(pulled.status())) {
        return pulled.status().WithContext("pulling this shard's part of the base");
      }
      if (pulled.ok()) {
        MapReference(part, &reference);
        if (reference && HoldsSlices(reference->view, wanted)) {
          source = "pulled";
        } else {
          reference.reset();
        }
      }
    }
    if (!reference) return plain("no part of the base holds this shard's slices");
  }

  EncodingStream stream(plan, checkpoint, reference ? &reference->view : nullptr, threads,
                        dir.empty() ? std::string() : TemporaryNameFor(held.path));
  std::optional<EdgeEncoding> coded_anyway;
  auto put = PutEncoded(endpoints_, options, tls_.get(), shard_target + query,
                        kEncodedShardMediaType, stream, &coded_anyway);
  // SHARDS_DROPPED: this shard is stored (other ranks' were dropped), so its reconstruction is
  // this rank's part of the version once they are sent again.
  if (!put.ok() && !coded_anyway) return put.status();
  const EdgeEncoding& coded = put.ok() ? put->coded : *coded_anyway;
  *coding = ShardCoding{put.ok() ? put->answer.body : nlohmann::json::object(), true,
                        coded.encoded_bytes, source, ""};
  if (!dir.empty()) {
    // The rank's part is known by the digest of the shard pushed, which the version's layout
    // lists (PlanShard::base_shard_sha256 of the next plan). The shard is stored either way: a
    // reference that cannot be kept only makes the next push pull its part.
    reference.reset();
    Status kept = ForgetSidecar(held);
    if (kept.ok()) kept = stream.KeepRestoredAs(held.path);
    if (kept.ok()) kept = WriteSidecar(held, version, coded.pushed_sha256);
    if (!kept.ok()) coding->reference_note = "not kept as the reference: " + kept.message();
  }
  return put.ok() ? Status::Ok() : put.status();
}

}  // namespace ckpt
