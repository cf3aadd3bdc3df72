// How the client reads ckptd's error answers (error_response.h).
#include "error_response.h"

#include <nlohmann/json.hpp>
#include <string>

namespace ckpt {
namespace {

using nlohmann::json;

// For answers without ckptd's error body (a proxy, a load balancer).
StatusCode CodeForHttp(unsigned status) {
  switch (status) {
    case 400:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    case 409:
      return StatusCode::kFailedPrecondition;
    case 413:
    case 507:
      return StatusCode::kResourceExhausted;
    case 503:
      return StatusCode::kUnavailable;
    default:
      return status >= 500 ? StatusCode::kInternal : StatusCode::kInvalidArgument;
  }
}

}  // namespace

Status ErrorFromResponse(unsigned http_status, std::string_view body) {
  std::string message = "HTTP " + std::to_string(http_status);
  StatusCode code = CodeForHttp(http_status);
  std::string reason;
  const json doc = json::parse(body, nullptr, false);
  if (!doc.is_discarded() && doc.contains("error") && doc["error"].is_object()) {
    const json& error = doc["error"];
    message = error.value("message", message);
    if (error.contains("code") && error["code"].is_string()) {
      const auto named = StatusCodeFromName(error["code"].get<std::string>());
      if (named && *named != StatusCode::kOk) code = *named;
    }
    if (error.contains("reason") && error["reason"].is_string()) {
      reason = error["reason"].get<std::string>();
    }
  }
  // 507: the daemon's data volume is full (RESOURCE_EXHAUSTED refined by NO_SPACE).
  if (http_status == 507 && code == StatusCode::kResourceExhausted) {
    return Status::NoSpace(std::move(message));
  }
  // 409 STALE_PLAN: an encoded push's plan is outdated; the client plans and encodes again.
  if (code == StatusCode::kFailedPrecondition && reason == "STALE_PLAN") {
    return Status::StalePlan(std::move(message));
  }
  // 400 REFERENCE_DRIFTED: an encoded push was coded against a reference that is not the
  // base's reconstruction; the client forgets it, pulls the base and encodes again.
  if (code == StatusCode::kInvalidArgument && reason == "REFERENCE_DRIFTED") {
    return Status::ReferenceDrifted(std::move(message));
  }
  // 409 SHARDS_DROPPED: this shard is stored; the commit it completed dropped other ranks'.
  if (code == StatusCode::kFailedPrecondition && reason == "SHARDS_DROPPED") {
    return Status::ShardsDropped(std::move(message));
  }
  return Status(code, std::move(message));
}

}  // namespace ckpt
