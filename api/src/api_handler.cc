#include "ckpt/api/api_handler.h"

#include <ctime>
#include <nlohmann/json.hpp>

#include "ckpt/codec/encoded_pull.h"
#include "hf_view.h"
#include "query_params.h"
#include "responses.h"
#include "status_page.h"

namespace ckpt::api {
namespace {

using nlohmann::json;

json GcJson(const GcReport& gc) {
  return {{"manifests_removed", gc.manifests_removed},
          {"bytes_freed", gc.bytes_freed},
          {"versions_rebased", gc.versions_rebased},
          {"bytes_rewritten", gc.bytes_rewritten},
          {"bytes_retained", gc.bytes_retained},
          {"compacted", gc.compacted},
          {"dropped_tensors_removed", gc.dropped_tensors_removed},
          {"orphan_chunks_removed", gc.orphan_chunks_removed},
          {"bytes_reclaimed", gc.bytes_reclaimed}};
}

json RetentionJson(const RetentionReport& report) {
  json kept = json::array();
  for (const RetentionDecision& d : report.decisions) {
    if (d.keep) kept.push_back({{"version", d.version}, {"kept_by", d.kept_by}});
  }
  json out = {{"model", report.model},
              {"dry_run", report.dry_run},
              {"policy", json::parse(report.policy.ToJson())},
              {"deleted", report.deleted},
              {"kept", std::move(kept)}};
  json dropped = json::array();
  for (const auto& [version, tensors] : report.tensors_dropped) {
    dropped.push_back({{"version", version}, {"tensors", tensors}});
  }
  out["tensors_dropped"] = std::move(dropped);
  out["problems"] = report.problems;
  if (!report.dry_run) out["gc"] = GcJson(report.gc);
  return out;
}

json ScrubJson(const ScrubReport& r) {
  return {{"model", r.model},
          {"clean", r.clean()},
          {"versions_checked", r.versions_checked},
          {"chunks_checked", r.chunks_checked},
          {"bytes_checked", r.bytes_checked},
          {"damaged_versions", r.damaged_versions},
          {"problems", r.problems},
          {"orphaned_manifests", r.orphaned_manifests},
          {"orphaned_chunks", r.orphaned_chunks}};
}

json DetailJson(const VersionDetail& d) {
  json out = VersionJson(d.info);
  json tensors = json::array();
  for (const TensorDetail& t : d.tensors) {
    json item = {{"name", t.name},
                 {"dtype", t.dtype},
                 {"shape", t.shape},
                 {"kind", t.kind},
                 {"codec", t.codec},
                 {"dropped", t.dropped},
                 {"chain_length", t.chain_length},
                 {"chunk_bytes", t.chunk_bytes},
                 {"raw_bytes", t.raw_bytes},
                 {"stored_bytes", t.stored_bytes},
                 {"bits_per_element", t.bits_per_element}};
    if (!t.tiles.empty()) item["tiles"] = t.tiles;
    if (t.codec == "lossy") {
      item["quantizer"] = t.quantizer;
      // The log quantizer codes pointwise-relative bounds; every other one absolute bounds.
      item[t.quantizer == "log" ? "max_pointwise_rel_error" : "max_abs_error"] = t.bound;
      item["exact_elements"] = t.exact_elements;
      item["entropy_bits_per_element"] = t.entropy_bits_per_element;
    }
    tensors.push_back(std::move(item));
  }
  out["tensors"] = std::move(tensors);
  return out;
}

json ModelJson(const ModelInfo& m) {
  return {{"name", m.name},
          {"latest_version", m.latest_version ? json(*m.latest_version) : json(nullptr)},
          {"version_count", m.version_count},
          {"raw_bytes", m.raw_bytes},
          {"stored_bytes", m.stored_bytes},
          {"created_at", Iso8601(m.created_at_ms)}};
}

json SkippedJson(const GcPassReport::Model& model) {
  return {{"model", model.name}, {"error", ErrorObject(model.status)}};
}

// How long an administrative collection waits for a model busy with a push or a background
// retention pass before reporting it busy.
constexpr std::chrono::seconds kAdminLockWait{30};

// The Hugging Face view of the version `route` names (resolved: "latest" may move on between
// the index and the files, so files are asked for by number), with its version number.
Result<std::pair<uint64_t, HfFiles>> HfFilesOf(CheckpointStore& store, const Route& route,
                                               std::optional<uint64_t> version) {
  CKPT_ASSIGN_OR_RETURN(const uint64_t max_file_bytes,
                        ParseHfQuery(route.query, kDefaultHfFileBytes));
  CKPT_ASSIGN_OR_RETURN(VersionDetail detail, store.GetVersionDetail(route.model, version));
  return std::make_pair(detail.info.version, PlanHfFiles(detail, max_file_bytes));
}

}  // namespace

std::string RetentionReportJson(const RetentionReport& report) {
  return Dump(RetentionJson(report));
}

std::string ScrubReportJson(const ScrubReport& report) { return Dump(ScrubJson(report)); }

std::string BackupResultJson(const BackupResult& b) {
  return Dump(json{{"dir", b.dir},
                   {"backup_id", b.backup_id},
                   {"created_at", Iso8601(b.created_at_ms)},
                   {"size_bytes", b.size_bytes},
                   {"files", b.files}});
}

int ApiHandler::HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
    case StatusCode::kIoError:
      return 500;
  }
  return 500;
}

int ApiHandler::HttpStatusFor(const Status& status) {
  if (status.subcode() == StatusSubcode::kNoSpace) return 507;
  return HttpStatusFor(status.code());
}

ApiResponse ApiHandler::ErrorResponse(const Status& status) {
  ApiResponse r = JsonResponse(HttpStatusFor(status), {{"error", ErrorObject(status)}});
  r.error_detail = status.detail();
  r.model_busy = status.code() == StatusCode::kAborted;
  if (status.code() == StatusCode::kUnauthenticated) {
    r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ckptd\"");
  }
  return r;
}

std::optional<ApiResponse> ApiHandler::WriteRedirect(std::string_view method, const Route& route,
                                                     std::string_view target) {
  const bool shard = route.kind == RouteKind::kShard || route.kind == RouteKind::kShardPlan;
  if (!IsRedirectedWrite(method, route) && !(shard && store_->ShardsGoToTheWriter())) {
    return std::nullopt;
  }
  auto owner = store_->WriteOwner(route.model);
  if (!owner.ok() || !*owner) return std::nullopt;  // errors surface from the handler itself
  if ((*owner)->empty()) {
    return ErrorResponse(Status::Unavailable("model '" + route.model +
                                             "' is written through another ckptd daemon, which "
                                             "advertises no URL (cluster.advertise_url)"));
  }
  std::string location = **owner;
  while (!location.empty() && location.back() == '/') location.pop_back();
  location += target;
  json error = ErrorObject("REDIRECT", "model '" + route.model + "' is written through " + **owner);
  error["location"] = location;
  ApiResponse r = JsonResponse(307, {{"error", std::move(error)}});
  r.headers.emplace_back("Location", location);
  return r;
}

ApiResponse ApiHandler::MethodNotAllowed(std::string_view method, const Route& route) {
  const std::string allowed(SpecOf(route.kind).methods);
  ApiResponse r = JsonResponse(
      405, {{"error",
             ErrorObject("METHOD_NOT_ALLOWED", "method " + std::string(method) +
                                                   " is not allowed here; allowed: " + allowed)}});
  r.headers.emplace_back("Allow", allowed);
  return r;
}

ApiResponse ApiHandler::Handle(std::string_view method, const Route& route, std::string_view body) {
  if (route.kind == RouteKind::kUnknown) return ErrorResponse(Status::NotFound("no such endpoint"));
  // An upload's version is checked before its method (HandleUpload).
  if (route.kind != RouteKind::kUpload && !RouteAllows(route, method)) {
    return MethodNotAllowed(method, route);
  }
  switch (route.kind) {
    case RouteKind::kUnknown:
      break;
    case RouteKind::kStatusPage: {
      auto page = RenderStatusPage(*store_, {route.model, route.model_prefix});
      ApiResponse r;
      if (!page.ok() && page.status().code() == StatusCode::kNotFound) {
        r.status = 404;  // a browser shows a page, not a JSON error
        r.body = RenderNotFoundPage(page.status().message());
      } else if (!page.ok()) {
        return ErrorResponse(page.status());
      } else {
        r.body = std::move(*page);
      }
      r.content_type = "text/html; charset=utf-8";
      // The page is self-contained: the browser may fetch nothing, run nothing.
      r.headers.emplace_back("Content-Security-Policy",
                             "default-src 'none'; style-src 'unsafe-inline'");
      r.headers.emplace_back("Cache-Control", "no-store");
      return r;
    }
    case RouteKind::kHealth: {
      // Alive and serving reads whatever the write state: 200 always.
      json health = {{"status", "ok"}};
      if (route.detail) {
        const StoreHealthReport report = store_->Health();
        health["writes"] = StoreHealthStateName(report.state);
        if (!report.reason.empty()) health["reason"] = report.reason;
      }
      return JsonResponse(200, health);
    }
    case RouteKind::kStoreStatus: {
      const StoreHealthReport report = store_->Health();
      json status = {
          {"writes", StoreHealthStateName(report.state)},
          {"pushes_accepted", report.state == StoreHealthReport::State::kWritable},
          {"deletes_accepted", report.state == StoreHealthReport::State::kWritable ||
                                   report.state == StoreHealthReport::State::kReserveReached},
          {"free_bytes", report.free_bytes},
          {"reserved_bytes", report.reserved_bytes},
          {"engine_errors", report.engine_errors},
          {"recoveries", report.recoveries}};
      if (!report.reason.empty()) status["reason"] = report.reason;
      if (const StoreStats stats = store_->Stats(); stats.space_known) {
        status["space"] = {{"data_directory_bytes", stats.data_directory_bytes},
                           {"stored_bytes", stats.stored_bytes},
                           {"garbage_bytes", stats.garbage_bytes},
                           {"metadata_bytes", stats.metadata_bytes}};
      }
      return JsonResponse(200, status);
    }
    case RouteKind::kMetrics: {
      ApiResponse r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics_.Render(*store_);
      return r;
    }
    case RouteKind::kListModels: {
      auto models = store_->ListModels();
      if (!models.ok()) return ErrorResponse(models.status());
      json list = json::array();
      for (const auto& m : *models) {
        if (m.name.rfind(route.model_prefix, 0) == 0) list.push_back(ModelJson(m));
      }
      return JsonResponse(200, {{"models", list}});
    }
    case RouteKind::kModel: {
      if (method == "GET") {
        auto model = store_->GetModel(route.model);
        if (!model.ok()) return ErrorResponse(model.status());
        return JsonResponse(200, ModelJson(*model));
      }
      if (method == "DELETE") {
        Status s = store_->DeleteModel(route.model);
        return s.ok() ? NoContent() : ErrorResponse(s);
      }
      return MethodNotAllowed(method, route);
    }
    case RouteKind::kListVersions: {
      auto versions = store_->ListVersions(route.model);
      if (!versions.ok()) return ErrorResponse(versions.status());
      json list = json::array();
      for (const auto& v : *versions) list.push_back(VersionJson(v));
      return JsonResponse(200, {{"model", route.model}, {"versions", list}});
    }
    case RouteKind::kPlan:
      return HandlePlan(route, body);
    case RouteKind::kShardPlan:
      return HandleShardPlan(route, body);
    case RouteKind::kShard:  // its PUT streams (RequestPlan::kPush)
      return MethodNotAllowed(method, route);
    case RouteKind::kUpload:
      return HandleUpload(method, route);
    case RouteKind::kUploadCommit:
      return HandleUploadCommit(route);
    case RouteKind::kHfFile: {
      if (route.file != kHfIndexName) {
        return ErrorResponse(Status::NotFound("no file '" + route.file.substr(0, 100) +
                                              "' in the Hugging Face view"));
      }
      auto number = ResolveVersion(route);
      if (!number.ok()) return ErrorResponse(number.status());
      auto files = HfFilesOf(*store_, route, *number);
      if (!files.ok()) return ErrorResponse(files.status());
      ApiResponse r;
      r.body = HfIndexJson(files->second, files->first);
      r.headers.emplace_back("X-Ckpt-Version", std::to_string(files->first));
      return r;
    }
    case RouteKind::kVersion: {
      if (method == "GET" && route.layout) {
        auto number = ResolveVersion(route);
        if (!number.ok()) return ErrorResponse(number.status());
        auto layout = store_->GetShardLayout(route.model, *number);
        if (!layout.ok()) return ErrorResponse(layout.status());
        return JsonResponse(200, json::parse(*layout));
      }
      if (method == "GET" && route.detail) {
        auto number = ResolveVersion(route);
        if (!number.ok()) return ErrorResponse(number.status());
        auto detail = store_->GetVersionDetail(route.model, *number);
        if (!detail.ok()) return ErrorResponse(detail.status());
        return JsonResponse(200, DetailJson(*detail));
      }
      if (method != "DELETE") return MethodNotAllowed(method, route);  // the others stream
      auto version = ParseVersionNumber(route.version);
      if (!version.ok()) return ErrorResponse(version.status());
      Status s = store_->DeleteVersion(route.model, *version);
      if (!s.ok()) return ErrorResponse(s);
      if (on_versions_changed_) on_versions_changed_(route.model);  // what it held is reclaimed
      return NoContent();
    }
    case RouteKind::kPolicy: {
      if (method == "GET") {
        auto policy = store_->GetPolicy(route.model);
        if (!policy.ok()) return ErrorResponse(policy.status());
        return JsonResponse(200, json::parse(policy->ToJson()));
      }
      if (method == "PUT") {
        Status name = ValidateModelName(route.model);
        if (!name.ok()) return ErrorResponse(name);
        auto current = store_->GetPolicy(route.model);
        CodecPolicy base;
        if (current.ok()) {
          base = *current;
        } else if (current.status().code() != StatusCode::kNotFound) {
          return ErrorResponse(current.status());
        }
        auto policy = CodecPolicy::FromJson(body, base);
        if (!policy.ok()) return ErrorResponse(policy.status());
        Status s = store_->SetPolicy(route.model, *policy);
        if (!s.ok()) return ErrorResponse(s);
        json answer = json::parse(policy->ToJson());
        if (auto warnings = policy->Warnings(); !warnings.empty()) answer["warnings"] = warnings;
        return JsonResponse(200, answer);
      }
      return MethodNotAllowed(method, route);
    }
    case RouteKind::kVersionTag: {
      auto version = ParseVersionNumber(route.version);
      if (!version.ok()) return ErrorResponse(version.status());
      if (method == "PUT") {
        Status s = store_->SetTag(route.model, route.tag, *version);
        if (!s.ok()) return ErrorResponse(s);
        auto info = store_->GetVersion(route.model, *version);
        if (!info.ok()) return ErrorResponse(info.status());
        return JsonResponse(200, VersionJson(*info));
      }
      auto named = store_->ResolveTag(route.model, route.tag);
      if (!named.ok()) return ErrorResponse(named.status());
      if (*named != *version) {
        return ErrorResponse(Status::NotFound("tag '" + route.tag + "' names version " +
                                              std::to_string(*named) + ", not " + route.version));
      }
      Status s = store_->RemoveTag(route.model, route.tag);
      return s.ok() ? NoContent() : ErrorResponse(s);
    }
    case RouteKind::kRetention: {
      if (method == "GET") {
        auto policy = store_->GetRetentionPolicy(route.model);
        if (!policy.ok()) return ErrorResponse(policy.status());
        return JsonResponse(200, json::parse(policy->ToJson()));
      }
      if (method == "PUT") {
        Status name = ValidateModelName(route.model);
        if (!name.ok()) return ErrorResponse(name);
        auto policy = RetentionPolicy::FromJson(body);
        if (!policy.ok()) return ErrorResponse(policy.status());
        Status s = store_->SetRetentionPolicy(route.model, *policy);
        if (!s.ok()) return ErrorResponse(s);
        return JsonResponse(200, json::parse(policy->ToJson()));
      }
      return MethodNotAllowed(method, route);
    }
    case RouteKind::kRetentionRun:
      return HandleRetentionRun(route, body);
    case RouteKind::kAdminGc:
      return HandleAdminGc();
    case RouteKind::kAdminScrub:
      return HandleAdminScrub();
    case RouteKind::kAdminBackup:
      return HandleAdminBackup(body);
  }
  return ErrorResponse(Status::Internal("unhandled route"));
}

Result<std::optional<uint64_t>> ApiHandler::ResolveVersion(const Route& route) {
  if (route.version == "latest") return std::optional<uint64_t>();
  if (route.version.starts_with("tag:")) {
    CKPT_ASSIGN_OR_RETURN(uint64_t version,
                          store_->ResolveTag(route.model, route.version.substr(4)));
    return std::optional<uint64_t>(version);
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t version, ParseVersionNumber(route.version));
  return std::optional<uint64_t>(version);
}

ApiResponse ApiHandler::HandleRetentionRun(const Route& route, std::string_view body) {
  RetentionRun run;
  run.dry_run = route.dry_run;
  if (body.find_first_not_of(" \t\r\n") != std::string_view::npos) {
    auto policy = RetentionPolicy::FromJson(body);
    if (!policy.ok()) return ErrorResponse(policy.status());
    run.policy = *policy;
  }
  auto report = store_->ApplyRetention(route.model, run);
  if (!report.ok()) return ErrorResponse(report.status());
  return JsonResponse(200, RetentionJson(*report));
}

ApiResponse ApiHandler::HandleAdminBackup(std::string_view body) {
  const json request = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object() || request.size() != 1 ||
      !request.contains("to") || !request["to"].is_string()) {
    return ErrorResponse(
        Status::InvalidArgument("backup: body must be {\"to\": \"/absolute/backup/directory\"}"));
  }
  const std::string to = request["to"];
  if (to.empty() || to.front() != '/') {
    return ErrorResponse(Status::InvalidArgument("backup: 'to' must be an absolute path"));
  }
  auto backup = maintenance_.Backup(to);
  if (!backup.ok()) return ErrorResponse(backup.status());
  return JsonResponse(200, json::parse(BackupResultJson(*backup)));
}

ApiResponse ApiHandler::HandleAdminScrub() {
  auto pass = maintenance_.ScrubAll();
  if (!pass.ok()) return ErrorResponse(pass.status());
  json reports = json::array();
  for (const ScrubReport& report : pass->models) reports.push_back(ScrubJson(report));
  return JsonResponse(200, {{"clean", pass->clean()}, {"models", reports}});
}

ApiResponse ApiHandler::HandleAdminGc() {
  // A model busy for longer than kAdminLockWait is skipped; the next pass takes it.
  auto pass = maintenance_.CollectAll(kAdminLockWait);
  if (!pass.ok()) return ErrorResponse(pass.status());
  json reports = json::array();
  for (const GcPassReport::Model& m : pass->models) {
    reports.push_back(m.status.ok() ? RetentionJson(m.report) : SkippedJson(m));
  }
  return JsonResponse(200, {{"models", reports},
                            {"deleted_versions", pass->deleted_versions},
                            {"bytes_freed", pass->bytes_freed},
                            {"bytes_reclaimed", pass->bytes_reclaimed}});
}

Result<std::unique_ptr<RestoreStream>> ApiHandler::OpenRestore(const Route& route) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(route.model));
  if (route.kind == RouteKind::kHfFile) {
    CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> version, ResolveVersion(route));
    CKPT_ASSIGN_OR_RETURN(auto files, HfFilesOf(*store_, route, version));
    auto it = files.second.tensors.find(route.file);
    if (it == files.second.tensors.end()) {
      return Status::NotFound(
          "no file '" + route.file.substr(0, 100) + "' in the Hugging Face view of version " +
          std::to_string(files.first) + " (see " + std::string(kHfIndexName) + ")");
    }
    RestoreSelection selection;
    selection.names = it->second;
    return store_->OpenRestore(route.model, files.first, selection);
  }
  CKPT_ASSIGN_OR_RETURN(const RestoreSelection selection, ParseRestoreQuery(route.query));
  CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> version, ResolveVersion(route));
  return store_->OpenRestore(route.model, version, selection);
}

Result<ApiHandler::RestoreAnswer> ApiHandler::BeginEncodedRestore(const Route& route) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(route.model));
  std::optional<uint64_t> since;
  CKPT_ASSIGN_OR_RETURN(const RestoreSelection selection, ParseRestoreQuery(route.query, &since));
  CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> version, ResolveVersion(route));
  RestoreAnswer answer;
  CKPT_ASSIGN_OR_RETURN(answer.stream,
                        store_->OpenEncodedRestore(route.model, version, since, selection));
  const VersionInfo& info = answer.stream->info();
  answer.headers = {{"X-Ckpt-Model", info.model},
                    {"X-Ckpt-Version", std::to_string(info.version)},
                    {"Content-Type", std::string(kEncodedPullMediaType)},
                    {"Vary", "Accept"}};
  return answer;
}

Result<ApiHandler::RestoreAnswer> ApiHandler::BeginRestore(const Route& route,
                                                           std::string_view range,
                                                           std::string_view if_range) {
  if (route.encoded_pull && route.kind == RouteKind::kVersion && !route.detail && !route.layout) {
    return BeginEncodedRestore(route);
  }
  CKPT_ASSIGN_OR_RETURN(auto whole, OpenRestore(route));
  RestoreAnswer answer;
  answer.headers = RestoreHeaders(whole->info());
  const std::string etag = "\"" + whole->info().sha256 + "\"";
  // Ranges of the whole version only (a selection's body has no digest to resume against).
  const bool rangeable = !whole->info().sha256.empty();
  if (rangeable) answer.headers.emplace_back("Accept-Ranges", "bytes");
  const auto bytes = rangeable && !range.empty() && (if_range.empty() || if_range == etag)
                         ? ParseByteRange(range, whole->size())
                         : std::nullopt;
  if (!bytes) {
    answer.stream = std::move(whole);
    return answer;
  }
  const std::string total = std::to_string(whole->size());
  if (bytes->first > bytes->second) {
    ApiResponse refused = ErrorResponse(
        Status::InvalidArgument("range '" + std::string(range.substr(0, 100)) +
                                "' starts past the end of the " + total + "-byte body"));
    refused.status = 416;
    refused.headers.emplace_back("Content-Range", "bytes */" + total);
    answer.refusal = std::move(refused);
    return answer;
  }
  RestoreSelection selection;
  selection.bytes = *bytes;
  // The version the whole restore resolved ("latest" may move on meanwhile).
  CKPT_ASSIGN_OR_RETURN(answer.stream,
                        store_->OpenRestore(route.model, whole->info().version, selection));
  answer.status = 206;
  answer.headers.emplace_back("Content-Range", "bytes " + std::to_string(bytes->first) + "-" +
                                                   std::to_string(bytes->second) + "/" + total);
  return answer;
}

std::optional<std::pair<uint64_t, uint64_t>> ParseByteRange(std::string_view header,
                                                            uint64_t size) {
  constexpr std::string_view kUnit = "bytes=";
  if (!header.starts_with(kUnit) || size == 0) return std::nullopt;
  header.remove_prefix(kUnit.size());
  const size_t dash = header.find('-');
  if (dash == std::string_view::npos || header.find(',') != std::string_view::npos) {
    return std::nullopt;
  }
  const std::string_view first_text = header.substr(0, dash), last_text = header.substr(dash + 1);
  if (first_text.empty()) {  // the last n bytes
    auto n = ParseVersionNumber(last_text);
    if (!n.ok() || *n == 0) return std::nullopt;
    return std::make_pair(size - std::min(*n, size), size - 1);
  }
  auto first = ParseVersionNumber(first_text);
  if (!first.ok()) return std::nullopt;
  uint64_t last = size - 1;
  if (!last_text.empty()) {
    auto parsed = ParseVersionNumber(last_text);
    if (!parsed.ok() || *parsed < *first) return std::nullopt;
    last = std::min(*parsed, size - 1);
  }
  if (*first >= size) return std::make_pair(uint64_t{1}, uint64_t{0});  // unsatisfiable
  return std::make_pair(*first, last);
}

std::vector<std::pair<std::string, std::string>> ApiHandler::RestoreHeaders(
    const VersionInfo& info) {
  // The body depends on Accept (an encoded pull answers the stored records instead).
  std::vector<std::pair<std::string, std::string>> headers = {
      {"X-Ckpt-Model", info.model},
      {"X-Ckpt-Version", std::to_string(info.version)},
      {"Vary", "Accept"}};
  // A part of a version (a selection) has no digest known before it is sent.
  if (!info.sha256.empty()) {
    headers.emplace_back("X-Ckpt-Sha256", info.sha256);
    headers.emplace_back("ETag", "\"" + info.sha256 + "\"");
  }
  return headers;
}

}  // namespace ckpt::api
