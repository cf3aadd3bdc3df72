// Shared JSON renderings (responses.h).
#include "responses.h"

#include <ctime>

namespace ckpt::api {

using nlohmann::json;

std::string Dump(const json& doc) {
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string Iso8601(int64_t ms) {
  std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[40];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

json VersionJson(const VersionInfo& v) {
  return {{"version", v.version},
          {"kind", v.kind},
          {"raw_bytes", v.raw_bytes},
          {"stored_bytes", v.stored_bytes},
          {"created_at", Iso8601(v.created_at_ms)},
          {"sha256", v.sha256},
          {"pushed_sha256", v.pushed_sha256},
          {"lossy", v.lossy},
          {"tensor_count", v.tensor_count},
          {"dropped_tensors", v.dropped_tensors},
          {"metrics", v.metrics},
          {"labels", v.labels},
          {"tags", v.tags}};
}

json UploadJson(const ShardUploadInfo& u) {
  std::vector<uint32_t> missing;
  size_t next = 0;
  for (uint32_t i = 0; i < u.shard_count && !u.committed; ++i) {
    while (next < u.received.size() && u.received[next] < i) ++next;
    if (next == u.received.size() || u.received[next] != i) missing.push_back(i);
  }
  json out = {
      {"model", u.model},        {"version", u.version}, {"shard_count", u.shard_count},
      {"received", u.received},  {"missing", missing},   {"received_bytes", u.received_bytes},
      {"committed", u.committed}};
  if (u.created_at_ms) out["created_at"] = Iso8601(u.created_at_ms);
  if (!u.committed && u.expires_at_ms) out["expires_at"] = Iso8601(u.expires_at_ms);
  if (!u.commit_through.empty()) out["commit_through"] = u.commit_through;
  return out;
}

ApiResponse JsonResponse(int status, const json& body) {
  ApiResponse r;
  r.status = status;
  r.body = Dump(body);
  r.body.push_back('\n');
  return r;
}

json ErrorObject(std::string_view code, std::string_view message) {
  return {{"code", std::string(code)}, {"message", std::string(message)}};
}

json ErrorObject(const Status& status) {
  json error = ErrorObject(StatusCodeName(status.code()), status.message());
  if (status.subcode() == StatusSubcode::kNoSpace) error["reason"] = "NO_SPACE";
  if (status.subcode() == StatusSubcode::kStalePlan) error["reason"] = "STALE_PLAN";
  if (status.subcode() == StatusSubcode::kReferenceDrifted) error["reason"] = "REFERENCE_DRIFTED";
  if (status.subcode() == StatusSubcode::kShardsDropped) error["reason"] = "SHARDS_DROPPED";
  return error;
}

ApiResponse NoContent() {
  ApiResponse r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

}  // namespace ckpt::api
