// Client::PushFileEncoded: a checkpoint coded on the client by the server's plan and streamed
// while it is coded (docs/api.md, "plan").
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckpt/base/model_name.h"
#include "ckpt/client/client.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "encoding_stream.h"
#include "held_reference.h"
#include "put_stream.h"
#include "query_strings.h"

namespace ckpt {
namespace {

using nlohmann::json;

bool NeedsReference(const CodingPlan& plan) {
  return std::any_of(plan.tensors.begin(), plan.tensors.end(), [](const PlannedTensor& t) {
    return t.kind == FrameKind::kDelta && t.byte_size > 0;
  });
}

}  // namespace

Result<PushResult> Client::PushFileEncoded(std::string_view model, uint64_t version,
                                           const std::string& path,
                                           const EncodedPushOptions& encoded,
                                           const PushMetadata& metadata) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  CKPT_ASSIGN_OR_RETURN(const MappedFile file, MappedFile::Open(path));
  auto parsed = CheckpointView::Parse(file.bytes());
  if (!parsed.ok()) return parsed.status().WithContext("'" + path + "'");
  std::optional<ReferenceLock> lock;
  if (!encoded.reference_dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(ReferenceLock claimed,
                          ReferenceLock::Acquire(encoded.reference_dir, model));
    lock.emplace(std::move(claimed));
  }
  // A version pushed by another writer while this one was coded makes its plan stale: plan,
  // pull the new base and code again. A reference that is not the base's reconstruction (a
  // damaged file, found by the server, or here when the server trusts its writers) is
  // forgotten once, and the base pulled.
  bool forgot_reference = false;
  int replans = 0;
  for (;;) {
    auto pushed = PushEncodedOnce(model, version, path, *parsed, encoded, metadata);
    if (pushed.ok()) {
      if (forgot_reference && pushed->encoded) {
        const std::string& note = pushed->reference_note;
        pushed->reference_note = "the reference held did not restore the base: pulled again" +
                                 (note.empty() ? "" : "; " + note);
      }
      return pushed;
    }
    const StatusSubcode why = pushed.status().subcode();
    if (why == StatusSubcode::kReferenceDrifted && !forgot_reference &&
        !encoded.reference_dir.empty()) {
      CKPT_RETURN_IF_ERROR(ForgetSidecar(HeldReferenceOf(encoded.reference_dir, model)));
      forgot_reference = true;
      continue;
    }
    if (why != StatusSubcode::kStalePlan || replans++ >= encoded.replans) return pushed;
  }
}

Result<PushResult> Client::PushEncodedOnce(std::string_view model, uint64_t version,
                                           const std::string& path,
                                           const CheckpointView& checkpoint,
                                           const EncodedPushOptions& encoded,
                                           const PushMetadata& metadata) {
  const std::string version_target = VersionTarget(model, std::to_string(version));
  CKPT_ASSIGN_OR_RETURN(const json plan_json,
                        PostForJson(endpoints_, options_, tls_.get(), version_target + "/plan",
                                    checkpoint.raw_header(), "application/octet-stream"));
  CKPT_ASSIGN_OR_RETURN(CodingPlan plan, CodingPlan::FromJson(plan_json.dump()));

  // The reference: the restored body of the plan's base, kept from before or pulled now.
  std::string reference_source;
  std::optional<MappedFile> reference_file;
  std::optional<CheckpointView> reference;
  const std::string& dir = encoded.reference_dir;
  // Without a reference directory, a base that must be pulled goes to a private temporary one,
  // removed when the push ends.
  std::optional<ScratchDir> scratch;
  if (dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(ScratchDir made, ScratchDir::Make());
    scratch.emplace(std::move(made));
  }
  HeldReference held = HeldReferenceOf(scratch ? scratch->path() : dir, model);
  if (NeedsReference(plan)) {
    const std::string& base_sha = plan.base->restored_sha256;
    const bool held_is_base = !dir.empty() && !base_sha.empty() && held.restored_sha256 == base_sha;
    if (held_is_base) {
      reference_source = "held";
    } else if (!base_sha.empty()) {
      // Encoded, since what is held when that saves bytes; kept in `dir` as the reference.
      EncodedPullOptions pull;
      pull.reference_dir = dir;
      auto pulled = PullEncodedClaimed(model, std::to_string(plan.base->version), held.path, pull);
      if (!pulled.ok()) return pulled.status().WithContext("pulling the base version");
      if (pulled->sha256 != base_sha) {
        return Status::StalePlan("version " + std::to_string(plan.base->version) +
                                 " changed while it was pulled: push again");
      }
      CKPT_RETURN_IF_ERROR(WriteSidecar(held, plan.base->version, base_sha));
      reference_source = "pulled";
    } else {
      // The base's version was deleted (its data is kept for the chains): nothing to pull.
      PushResult result;
      CKPT_ASSIGN_OR_RETURN(result, PushFile(model, version, path, metadata));
      result.reference_note =
          "the base version was deleted and cannot be pulled: the server coded this push";
      return result;
    }
    auto mapped = MappedFile::Open(held.path);
    Status read = mapped.status();
    std::optional<CheckpointView> view;
    if (mapped.ok()) {
      reference_file.emplace(std::move(mapped).value());
      auto parsed = CheckpointView::Parse(reference_file->bytes());
      read = parsed.status();
      if (parsed.ok()) view.emplace(std::move(parsed).value());
    }
    if (!view) {
      const Status unreadable = read.WithContext("the reference '" + held.path + "'");
      // A kept one that cannot be read is forgotten and the base pulled, as a drifted one is.
      return reference_source == "held" ? Status::ReferenceDrifted(unreadable.message())
                                        : unreadable;
    }
    reference.emplace(std::move(*view));
    // Its digest was checked when it was stored (or just now, pulled). A daemon that decodes
    // the payloads refuses a delta coded against a drifted one; one that trusts its writers
    // relies on this check.
    const bool server_decodes = plan_json.value("decode_encoded_payloads", true);
    if (!server_decodes && reference_source == "held" && reference->Sha256Hex() != base_sha) {
      return Status::ReferenceDrifted("the reference '" + held.path +
                                      "' is not the reconstruction of version " +
                                      std::to_string(plan.base->version));
    }
    plan.base->restored_sha256.clear();
  }

  // Encode on a thread of its own while the connection sends what is ready. The restored body
  // goes to a file beside the reference as it is coded (not to memory), and replaces the
  // reference once the version is committed.
  EncodingStream stream(plan, checkpoint, reference ? &*reference : nullptr,
                        CodecThreads(encoded.threads),
                        dir.empty() ? std::string() : TemporaryNameFor(held.path));
  CKPT_ASSIGN_OR_RETURN(const EncodedPut put, PutEncoded(endpoints_, options_, tls_.get(),
                                                         version_target + PushQuery(metadata),
                                                         kEncodedBodyMediaType, stream));
  if (put.answer.status != 201) return Status::Internal("push answered " + put.answer.body.dump());
  PushResult result = PushResultFromJson(put.answer.body);
  result.encoded = true;
  result.sent_bytes = put.coded.encoded_bytes;
  result.reference = reference_source;
  if (!dir.empty()) {
    reference.reset();
    reference_file.reset();
    // The version is stored either way: a reference that cannot be kept only makes the next
    // push pull its base.
    Status kept = ForgetSidecar(held);
    if (kept.ok()) kept = stream.KeepRestoredAs(held.path);
    if (kept.ok()) kept = WriteSidecar(held, version, put.coded.restored_sha256);
    if (!kept.ok()) result.reference_note = "not kept as the reference: " + kept.message();
  }
  return result;
}

}  // namespace ckpt
