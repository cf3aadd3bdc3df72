// The client takes the error code from the daemon's error body, not from the HTTP status (409
// alone cannot tell ABORTED, retryable, from FAILED_PRECONDITION).
#include "error_response.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt {
namespace {

std::string Body(std::string_view code, std::string_view message) {
  return R"({"error":{"code":")" + std::string(code) + R"(","message":")" + std::string(message) +
         R"("}})";
}

TEST(ErrorFromResponse, EveryCodeComesBackFromTheBody) {
  struct Case {
    StatusCode code;
    unsigned http;
  };
  // Each code with the HTTP status the daemon sends it under.
  const Case cases[] = {
      {StatusCode::kInvalidArgument, 400}, {StatusCode::kNotFound, 404},
      {StatusCode::kAlreadyExists, 409},   {StatusCode::kFailedPrecondition, 409},
      {StatusCode::kAborted, 409},         {StatusCode::kResourceExhausted, 413},
      {StatusCode::kDataLoss, 500},        {StatusCode::kUnavailable, 503},
      {StatusCode::kInternal, 500},        {StatusCode::kIoError, 500},
      {StatusCode::kUnauthenticated, 401}, {StatusCode::kPermissionDenied, 403},
  };
  for (const Case& c : cases) {
    const Status s = ErrorFromResponse(c.http, Body(StatusCodeName(c.code), "what happened"));
    EXPECT_EQ(s.code(), c.code) << StatusCodeName(c.code);
    EXPECT_EQ(s.message(), "what happened");
  }
}

TEST(ErrorFromResponse, WithoutADaemonBodyTheHttpStatusDecides) {
  EXPECT_EQ(ErrorFromResponse(409, "").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrorFromResponse(503, "<html>busy</html>").code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrorFromResponse(502, "").code(), StatusCode::kInternal);
  EXPECT_EQ(ErrorFromResponse(502, "").message(), "HTTP 502");
  // A code the client does not know (a newer daemon), or OK in an error: the HTTP status.
  EXPECT_EQ(ErrorFromResponse(404, Body("SOMETHING_NEW", "m")).code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrorFromResponse(409, Body("OK", "m")).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrorFromResponse(409, R"({"error":{"code":7}})").code(),
            StatusCode::kFailedPrecondition);
}

TEST(ErrorFromResponse, A507IsNoSpace) {
  const Status s = ErrorFromResponse(507, Body("RESOURCE_EXHAUSTED", "the data volume is full"));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.subcode(), StatusSubcode::kNoSpace);
  EXPECT_EQ(s.message(), "the data volume is full");
  EXPECT_EQ(ErrorFromResponse(413, Body("RESOURCE_EXHAUSTED", "m")).subcode(),
            StatusSubcode::kNone);
  EXPECT_EQ(ErrorFromResponse(507, "").subcode(), StatusSubcode::kNoSpace);
}

// 409 STALE_PLAN: the encoded push's plan is outdated, which the client answers by planning and
// coding again; any other 409 FAILED_PRECONDITION is not.
TEST(ErrorFromResponse, AStalePlanIsToldApart) {
  const Status s = ErrorFromResponse(
      409,
      R"({"error":{"code":"FAILED_PRECONDITION","message":"ask for a new plan","reason":"STALE_PLAN"}})");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.subcode(), StatusSubcode::kStalePlan);
  EXPECT_EQ(s.message(), "ask for a new plan");
  EXPECT_EQ(ErrorFromResponse(409, Body("FAILED_PRECONDITION", "m")).subcode(),
            StatusSubcode::kNone);
}

TEST(ErrorFromResponse, DroppedShardsAreToldApart) {
  const Status s = ErrorFromResponse(
      409,
      R"({"error":{"code":"FAILED_PRECONDITION","message":"shard 0 dropped","reason":"SHARDS_DROPPED"}})");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.subcode(), StatusSubcode::kShardsDropped);
  EXPECT_EQ(s.message(), "shard 0 dropped");
  // The reason refines its own code only.
  EXPECT_EQ(
      ErrorFromResponse(
          400, R"({"error":{"code":"INVALID_ARGUMENT","message":"m","reason":"SHARDS_DROPPED"}})")
          .subcode(),
      StatusSubcode::kNone);
}

TEST(StatusCodeFromName, InvertsStatusCodeName) {
  for (int i = 0; i <= static_cast<int>(StatusCode::kPermissionDenied); ++i) {
    const auto code = static_cast<StatusCode>(i);
    EXPECT_EQ(StatusCodeFromName(StatusCodeName(code)), code);
  }
  EXPECT_EQ(StatusCodeFromName("UNKNOWN"), std::nullopt);
  EXPECT_EQ(StatusCodeFromName("not_found"), std::nullopt);
}

}  // namespace
}  // namespace ckpt
