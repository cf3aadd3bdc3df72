// The push routes: a whole version (PUT .../versions/{v}) or one shard of a sharded version
// (PUT .../versions/{v}/shards/{i}?of=N) streamed into the store, and the upload routes
// (GET|DELETE .../shards, POST .../shards:commit).
#include "ckpt/api/api_handler.h"
#include "ckpt/codec/encoded_body.h"
#include "responses.h"

namespace ckpt::api {

using nlohmann::json;

namespace {

Result<uint32_t> ParseShardIndex(const std::string& text) {
  auto shard = ParseVersionNumber(text);
  if (!shard.ok() || *shard > UINT32_MAX) {
    return Status::InvalidArgument("shard index '" + text.substr(0, 40) +
                                   "' is not a decimal 32-bit unsigned integer");
  }
  return static_cast<uint32_t>(*shard);
}

}  // namespace

// A whole version: the store's push session.
class VersionBody final : public PushBody {
 public:
  VersionBody(ApiHandler* handler, std::unique_ptr<PushSession> session)
      : handler_(handler), session_(std::move(session)) {}
  Status Write(std::span<const uint8_t> bytes) override { return session_->Write(bytes); }
  ApiResponse Finish() override {
    auto info = session_->Commit();
    session_.reset();  // releases the model before the hook and the answer
    if (!info.ok()) return ApiHandler::ErrorResponse(info.status());
    if (handler_->on_versions_changed_) handler_->on_versions_changed_(info->model);
    json body = VersionJson(*info);
    body["model"] = info->model;
    ApiResponse r = JsonResponse(201, body);
    r.headers.emplace_back(
        "Location", "/v1/models/" + info->model + "/versions/" + std::to_string(info->version));
    return r;
  }

 private:
  ApiHandler* const handler_;
  std::unique_ptr<PushSession> session_;
};

// One shard: the store's shard session.
class ShardBody final : public PushBody {
 public:
  ShardBody(ApiHandler* handler, std::unique_ptr<ShardSession> session)
      : handler_(handler), session_(std::move(session)) {}
  Status Write(std::span<const uint8_t> bytes) override { return session_->Write(bytes); }
  ApiResponse Finish() override {
    auto result = session_->Finish();
    session_.reset();
    if (!result.ok()) return ApiHandler::ErrorResponse(result.status());
    return handler_->ShardResponse(*result);
  }

 private:
  ApiHandler* const handler_;
  std::unique_ptr<ShardSession> session_;
};

ApiResponse ApiHandler::ShardResponse(const ShardResult& result) {
  json body = {{"upload", UploadJson(result.upload)}};
  if (!result.version) return JsonResponse(202, body);
  const VersionInfo& info = *result.version;
  json version = VersionJson(info);
  version["model"] = info.model;
  body["version"] = std::move(version);
  // A shard sent again after the commit changes nothing: 200, the version as it is.
  if (result.sent_again) return JsonResponse(200, body);
  if (on_versions_changed_) on_versions_changed_(info.model);
  ApiResponse r = JsonResponse(201, body);
  r.headers.emplace_back("Location",
                         "/v1/models/" + info.model + "/versions/" + std::to_string(info.version));
  return r;
}

Result<std::unique_ptr<PushBody>> ApiHandler::BeginPush(const Route& route,
                                                        std::optional<uint64_t> content_length) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(route.model));
  if (route.version == "latest") {
    return Status::InvalidArgument("'latest' cannot be pushed; PUT needs a version number");
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t version, ParseVersionNumber(route.version));
  if (route.kind == RouteKind::kShard) {
    if (route.encoded_body) {
      return Status::InvalidArgument("a shard coded by its rank is sent as " +
                                     std::string(kEncodedShardMediaType) +
                                     ", by the plan of POST .../shards/{shard}/plan");
    }
    CKPT_ASSIGN_OR_RETURN(const uint32_t shard, ParseShardIndex(route.shard));
    CKPT_ASSIGN_OR_RETURN(auto query, ParseShardQuery(route.query));
    if (route.encoded_shard) {
      query.second.body_format = PushBodyFormat::kEncoded;
      query.second.decode_encoded_payloads = decode_encoded_payloads_;
    }
    CKPT_ASSIGN_OR_RETURN(auto session, store_->BeginShard(route.model, version, shard, query.first,
                                                           content_length, query.second));
    return std::unique_ptr<PushBody>(std::make_unique<ShardBody>(this, std::move(session)));
  }
  if (route.encoded_shard) {
    return Status::InvalidArgument(
        "an encoded shard is sent to /v1/models/{model}/versions/{version}/shards/{shard}; a "
        "whole version coded at the edge is sent as " +
        std::string(kEncodedBodyMediaType));
  }
  CKPT_ASSIGN_OR_RETURN(PushOptions options, ParsePushQuery(route.query));
  if (route.encoded_body) {
    options.body_format = PushBodyFormat::kEncoded;
    options.decode_encoded_payloads = decode_encoded_payloads_;
  }
  CKPT_ASSIGN_OR_RETURN(auto session,
                        store_->BeginPush(route.model, version, content_length, options));
  return std::unique_ptr<PushBody>(std::make_unique<VersionBody>(this, std::move(session)));
}

ApiResponse ApiHandler::HandlePlan(const Route& route, std::string_view raw_header) {
  if (route.version == "latest") {
    return ErrorResponse(
        Status::InvalidArgument("'latest' cannot be pushed; a plan needs a version number"));
  }
  auto version = ParseVersionNumber(route.version);
  if (!version.ok()) return ErrorResponse(version.status());
  auto plan = store_->PlanPush(route.model, *version, raw_header);
  if (!plan.ok()) return ErrorResponse(plan.status());
  json answer = json::parse(plan->ToJson());
  // Not part of the plan (nor of its digest): a client whose payloads this daemon does not
  // decode checks its reference itself before coding against it.
  answer["decode_encoded_payloads"] = decode_encoded_payloads_;
  return JsonResponse(200, answer);
}

ApiResponse ApiHandler::HandleShardPlan(const Route& route, std::string_view raw_header) {
  if (route.version == "latest") {
    return ErrorResponse(
        Status::InvalidArgument("'latest' cannot be pushed; a plan needs a version number"));
  }
  auto version = ParseVersionNumber(route.version);
  if (!version.ok()) return ErrorResponse(version.status());
  auto shard = ParseShardIndex(route.shard);
  if (!shard.ok()) return ErrorResponse(shard.status());
  auto query = ParseShardQuery(route.query);
  if (!query.ok()) return ErrorResponse(query.status());
  auto plan = store_->PlanShard(route.model, *version, *shard, query->first, raw_header);
  if (!plan.ok()) return ErrorResponse(plan.status());
  return JsonResponse(200, json::parse(plan->ToJson()));
}

ApiResponse ApiHandler::HandleUpload(std::string_view method, const Route& route) {
  auto version = ParseVersionNumber(route.version);
  if (!version.ok()) return ErrorResponse(version.status());
  if (method == "GET") {
    auto upload = store_->GetUpload(route.model, *version);
    if (!upload.ok()) return ErrorResponse(upload.status());
    return JsonResponse(200, UploadJson(*upload));
  }
  if (method == "DELETE") {
    Status s = store_->AbortUpload(route.model, *version);
    return s.ok() ? NoContent() : ErrorResponse(s);
  }
  return MethodNotAllowed(method, route);
}

ApiResponse ApiHandler::HandleUploadCommit(const Route& route) {
  auto version = ParseVersionNumber(route.version);
  if (!version.ok()) return ErrorResponse(version.status());
  auto options = ParsePushQuery(route.query);
  if (!options.ok()) return ErrorResponse(options.status());
  auto result = store_->CommitUpload(route.model, *version, *options);
  if (!result.ok()) return ErrorResponse(result.status());
  return ShardResponse(*result);
}

}  // namespace ckpt::api
