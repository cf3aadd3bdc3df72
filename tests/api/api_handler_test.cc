#include "ckpt/api/api_handler.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace ckpt::api {
namespace {

using nlohmann::json;
using testing::DriftingModel;
using testing::TempDir;

TEST(ApiRouting, ClassifiesEveryRoute) {
  EXPECT_EQ(ClassifyTarget("/healthz").kind, RouteKind::kHealth);
  EXPECT_EQ(ClassifyTarget("/v1/models").kind, RouteKind::kListModels);
  EXPECT_EQ(ClassifyTarget("/v1/models?x=1").kind, RouteKind::kListModels);
  Route m = ClassifyTarget("/v1/models/resnet");
  EXPECT_EQ(m.kind, RouteKind::kModel);
  EXPECT_EQ(m.model, "resnet");
  EXPECT_EQ(ClassifyTarget("/v1/models/r/versions").kind, RouteKind::kListVersions);
  EXPECT_EQ(ClassifyTarget("/v1/models/r/policy").kind, RouteKind::kPolicy);
  Route v = ClassifyTarget("/v1/models/r/versions/latest");
  EXPECT_EQ(v.kind, RouteKind::kVersion);
  EXPECT_EQ(v.version, "latest");
  for (const char* unknown :
       {"/v2/models", "/v1/models/r/versions/1/x", "v1/models", "/v1/models/r/blobs", "//"}) {
    EXPECT_EQ(ClassifyTarget(unknown).kind, RouteKind::kUnknown) << unknown;
  }
}

TEST(ApiRouting, ClassifiesTheStatusPage) {
  EXPECT_EQ(ClassifyTarget("/").kind, RouteKind::kStatusPage);
  EXPECT_EQ(ClassifyTarget("/").model, "");
  const Route one = ClassifyTarget("/?model=run%2Da.1&x=y");
  EXPECT_EQ(one.kind, RouteKind::kStatusPage);
  EXPECT_EQ(one.model, "run-a.1");
  EXPECT_EQ(ClassifyTarget("/?model=%zz").model, "");  // malformed: the overview
}

TEST(ApiRouting, ClassifiesLifecycleRoutes) {
  Route tag = ClassifyTarget("/v1/models/r/versions/7/tags/best");
  EXPECT_EQ(tag.kind, RouteKind::kVersionTag);
  EXPECT_EQ(tag.version, "7");
  EXPECT_EQ(tag.tag, "best");
  EXPECT_EQ(ClassifyTarget("/v1/models/r/retention").kind, RouteKind::kRetention);
  Route preview = ClassifyTarget("/v1/models/r/retention:preview");
  EXPECT_EQ(preview.kind, RouteKind::kRetentionRun);
  EXPECT_TRUE(preview.dry_run);
  EXPECT_FALSE(ClassifyTarget("/v1/models/r/retention:apply").dry_run);
  EXPECT_TRUE(ClassifyTarget("/v1/models/r/retention:apply?dry_run=1").dry_run);
  EXPECT_EQ(ClassifyTarget("/v1/admin/gc").kind, RouteKind::kAdminGc);
  EXPECT_EQ(ClassifyTarget("/v1/models/r/versions/tag%3Abest").version, "tag:best");
  EXPECT_EQ(ClassifyTarget("/v1/models/r/versions/9?metric.loss=1").query, "metric.loss=1");
  EXPECT_EQ(ClassifyTarget("/v1/models/r/retention:delete").kind, RouteKind::kUnknown);
}

TEST(ApiRouting, PushQueryCarriesMetricsLabelsAndTags) {
  auto options = ParsePushQuery("metric.loss=1.25&label.host=node%2F7+a&tag=best&tag=rc1");
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->metrics.at("loss"), 1.25);
  EXPECT_EQ(options->labels.at("host"), "node/7 a");
  EXPECT_EQ(options->tags, (std::vector<std::string>{"best", "rc1"}));
  EXPECT_TRUE(ParsePushQuery("").ok());
  for (const char* bad : {"metric.loss=abc", "metric.loss=", "metric.loss=inf", "colour=red",
                          "label.x=%zz", "tag=%4"}) {
    EXPECT_EQ(ParsePushQuery(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ApiRouting, PlansStreamingOnlyForVersionTransfers) {
  Route v = ClassifyTarget("/v1/models/r/versions/3");
  EXPECT_EQ(PlanOf("PUT", v), RequestPlan::kPush);
  EXPECT_EQ(PlanOf("GET", v), RequestPlan::kRestore);
  EXPECT_EQ(PlanOf("HEAD", v), RequestPlan::kRestore);
  EXPECT_EQ(PlanOf("DELETE", v), RequestPlan::kSimple);
  EXPECT_EQ(PlanOf("PUT", ClassifyTarget("/v1/models/r/policy")), RequestPlan::kSimple);
}

TEST(ApiErrors, StatusCodesMapToHttp) {
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kFailedPrecondition), 409);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kAborted), 409);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kResourceExhausted), 413);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kDataLoss), 500);
  EXPECT_EQ(ApiHandler::HttpStatusFor(StatusCode::kUnavailable), 503);
  ApiResponse r = ApiHandler::ErrorResponse(Status::NotFound("model 'x' not found"));
  EXPECT_EQ(r.status, 404);
  json body = json::parse(r.body);
  EXPECT_EQ(body["error"]["code"], "NOT_FOUND");
  EXPECT_EQ(body["error"]["message"], "model 'x' not found");
}

TEST(ApiErrors, AFullVolumeIs507AndTheDetailStaysInTheLog) {
  const Status full = Status::NoSpace("writing chunk: no space left on the data volume")
                          .WithDetail("IO error: No space left on device: /srv/ckptd/000012.log")
                          .WithContext("push of version 7");
  EXPECT_EQ(ApiHandler::HttpStatusFor(full), 507);
  ApiResponse r = ApiHandler::ErrorResponse(full);
  EXPECT_EQ(r.status, 507);
  json body = json::parse(r.body);
  EXPECT_EQ(body["error"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(body["error"]["reason"], "NO_SPACE");
  EXPECT_EQ(body["error"]["message"],
            "push of version 7: writing chunk: no space left on the data volume");
  EXPECT_EQ(r.body.find("/srv/ckptd"), std::string::npos);
  EXPECT_NE(r.error_detail.find("/srv/ckptd/000012.log"), std::string::npos);
  // A size limit of the request stays 413, without a reason.
  ApiResponse limit = ApiHandler::ErrorResponse(Status::ResourceExhausted("too many tensors"));
  EXPECT_EQ(limit.status, 413);
  EXPECT_FALSE(json::parse(limit.body)["error"].contains("reason"));
}

TEST(ApiRouting, ClassifiesTheStatusRoutes) {
  EXPECT_EQ(ClassifyTarget("/v1/status").kind, RouteKind::kStoreStatus);
  const Route health = ClassifyTarget("/healthz?detail=1");
  EXPECT_EQ(health.kind, RouteKind::kHealth);
  EXPECT_TRUE(health.detail);
  EXPECT_FALSE(ClassifyTarget("/healthz").detail);
}

TEST(ApiVersions, ParsesOnlyDecimalU64) {
  EXPECT_EQ(*ParseVersionNumber("0"), 0u);
  EXPECT_EQ(*ParseVersionNumber("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", "1e3", "0x10", "18446744073709551616", "12a", " 1"}) {
    EXPECT_EQ(ParseVersionNumber(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

class ApiHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.data_dir = dir_.str();
    store_ = std::move(CheckpointStore::Open(options)).value();
    handler_ = std::make_unique<ApiHandler>(store_.get());
  }

  ApiResponse Call(std::string_view method, std::string_view target, std::string_view body = {}) {
    return handler_->Handle(method, ClassifyTarget(target), body);
  }

  void Push(std::string_view model, uint64_t version, const std::string& body) {
    Route route =
        ClassifyTarget("/v1/models/" + std::string(model) + "/versions/" + std::to_string(version));
    auto session = handler_->BeginPush(route, body.size());
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    ASSERT_TRUE((*session)
                    ->Write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()),
                                                     body.size()))
                    .ok());
    ApiResponse r = handler_->FinishPush(**session);
    ASSERT_EQ(r.status, 201) << r.body;
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<ApiHandler> handler_;
};

TEST_F(ApiHandlerTest, HealthAndEmptyListing) {
  EXPECT_EQ(Call("GET", "/healthz").body, "{\"status\":\"ok\"}\n");
  ApiResponse models = Call("GET", "/v1/models");
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["models"].size(), 0u);
}

TEST_F(ApiHandlerTest, StatusPageEscapesEverythingClientsWrote) {
  ApiResponse empty = Call("GET", "/");
  ASSERT_EQ(empty.status, 200);
  EXPECT_EQ(empty.content_type, "text/html; charset=utf-8");
  EXPECT_NE(empty.body.find("No models yet."), std::string::npos);

  // Tensor-name patterns are free text (names are validated, patterns cannot be).
  ASSERT_EQ(Call("PUT", "/v1/models/m/policy", R"({"lossless_tensors": ["<img src=x>*"]})").status,
            200);
  DriftingModel drift(5, 2000);
  Push("m", 1, drift.Next());
  ApiResponse page = Call("GET", "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("&quot;&lt;img src=x&gt;*&quot;"), std::string::npos);
  EXPECT_EQ(page.body.find("<img"), std::string::npos);
  EXPECT_EQ(Call("POST", "/").status, 405);
  EXPECT_EQ(Call("GET", "/?model=absent").status, 404);
}

// Found by the http_request fuzzer: an error message echoing invalid UTF-8 made the JSON
// serializer throw, and the connection was dropped without an answer.
TEST_F(ApiHandlerTest, InvalidUtf8InEchoedTextIsReplacedNotFatal) {
  DriftingModel drift(6, 1000);
  Push("m", 1, drift.Next());
  const ApiResponse bad = Call("GET", "/v1/models/m/versions/lades%F4t?detail=1");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("lades\xEF\xBF\xBDt"), std::string::npos) << bad.body;  // U+FFFD

  const std::string body = drift.Next();
  auto session =
      handler_->BeginPush(ClassifyTarget("/v1/models/m/versions/2?label.host=%FF"), body.size());
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ASSERT_TRUE((*session)->Write({reinterpret_cast<const uint8_t*>(body.data()), body.size()}).ok());
  EXPECT_EQ(handler_->FinishPush(**session).status, 201);
  const ApiResponse listed = Call("GET", "/v1/models/m/versions");
  EXPECT_EQ(listed.status, 200);
  EXPECT_NE(listed.body.find("\"host\":\"\xEF\xBF\xBD\""), std::string::npos) << listed.body;
}

TEST_F(ApiHandlerTest, ListsModelsAndVersionsWithContractFields) {
  DriftingModel model(1, 1000);
  Push("a", 10, model.Next());
  Push("a", 20, model.Next());
  json models = json::parse(Call("GET", "/v1/models").body)["models"];
  ASSERT_EQ(models.size(), 1u);
  for (const char* field :
       {"name", "latest_version", "version_count", "raw_bytes", "stored_bytes"}) {
    EXPECT_TRUE(models[0].contains(field)) << field;
  }
  EXPECT_EQ(models[0]["latest_version"], 20);
  json versions = json::parse(Call("GET", "/v1/models/a/versions").body)["versions"];
  ASSERT_EQ(versions.size(), 2u);
  for (const char* field :
       {"version", "kind", "raw_bytes", "stored_bytes", "created_at", "sha256"}) {
    EXPECT_TRUE(versions[1].contains(field)) << field;
  }
  EXPECT_EQ(versions[1]["kind"], "delta");
  EXPECT_EQ(json::parse(Call("GET", "/v1/models/a").body)["version_count"], 2);
}

TEST_F(ApiHandlerTest, PushConflictsAndBadInputsGetPreciseErrors) {
  DriftingModel model(2, 100);
  Push("a", 10, model.Next());
  auto stale = handler_->BeginPush(ClassifyTarget("/v1/models/a/versions/10"), 100);
  EXPECT_EQ(ApiHandler::ErrorResponse(stale.status()).status, 409);
  EXPECT_NE(stale.status().message().find("latest version 10"), std::string::npos);
  auto latest = handler_->BeginPush(ClassifyTarget("/v1/models/a/versions/latest"), 100);
  EXPECT_EQ(latest.status().code(), StatusCode::kInvalidArgument);
  auto bad_name = handler_->BeginPush(ClassifyTarget("/v1/models/-a/versions/1"), 100);
  EXPECT_EQ(bad_name.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Call("GET", "/v1/models/nope").status, 404);
  EXPECT_EQ(Call("GET", "/v1/models/nope/versions").status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/models/a/versions/11").status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/models/a/versions/x").status, 400);
  EXPECT_EQ(Call("GET", "/nothing").status, 404);
}

TEST_F(ApiHandlerTest, WrongMethodsGet405WithAllow) {
  ApiResponse r = Call("POST", "/v1/models/a/policy");
  EXPECT_EQ(r.status, 405);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Allow");
  EXPECT_EQ(r.headers[0].second, "GET, PUT");
  EXPECT_EQ(Call("PATCH", "/v1/models/a/versions/1").status, 405);
  EXPECT_EQ(Call("PUT", "/v1/models").status, 405);
}

TEST_F(ApiHandlerTest, PolicyGetPutAndValidation) {
  EXPECT_EQ(Call("GET", "/v1/models/p/policy").status, 404);
  ApiResponse put = Call("PUT", "/v1/models/p/policy", R"({"mode":"lossless","keyframe_every":5})");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(json::parse(Call("GET", "/v1/models/p/policy").body)["keyframe_every"], 5);
  ApiResponse bad = Call("PUT", "/v1/models/p/policy", R"({"keyframe_every":-2})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("keyframe_every"), std::string::npos);
  EXPECT_EQ(json::parse(Call("GET", "/v1/models/p/policy").body)["keyframe_every"], 5);
  // A partial update keeps the other fields.
  ASSERT_EQ(Call("PUT", "/v1/models/p/policy", R"({"mode":"lossless"})").status, 200);
  EXPECT_EQ(json::parse(Call("GET", "/v1/models/p/policy").body)["keyframe_every"], 5);
}

TEST_F(ApiHandlerTest, DeleteReturns204AndRemoves) {
  DriftingModel model(3, 100);
  Push("a", 1, model.Next());
  Push("a", 2, model.Next());
  EXPECT_EQ(Call("DELETE", "/v1/models/a/versions/1").status, 204);
  EXPECT_EQ(json::parse(Call("GET", "/v1/models/a").body)["version_count"], 1);
  EXPECT_EQ(Call("DELETE", "/v1/models/a").status, 204);
  EXPECT_EQ(Call("GET", "/v1/models/a").status, 404);
}

TEST_F(ApiHandlerTest, RestoreHeadersCarrySha256) {
  DriftingModel model(4, 100);
  std::string body = model.Next();
  Push("a", 1, body);
  auto stream = handler_->OpenRestore(ClassifyTarget("/v1/models/a/versions/latest"));
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ((*stream)->size(), body.size());
  bool found = false;
  for (const auto& [k, v] : ApiHandler::RestoreHeaders((*stream)->info())) {
    if (k == "X-Ckpt-Sha256") {
      EXPECT_EQ(v, testing::Sha256Hex(body));
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace ckpt::api
