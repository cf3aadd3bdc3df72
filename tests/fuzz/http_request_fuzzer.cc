// Fuzzes the HTTP request path: raw request bytes through Boost.Beast's parser (as the server
// reads them), then routing, authorization, query parsing and the handlers — pushes, restores,
// policies, retention, tags, listings — against a real store in a temporary directory seeded
// with lossless and lossy models. Invariants: no crash or sanitizer report, no 5xx answer
// other than 503 (a 500 means a bug or corrupt data), and a restore streams exactly the size it
// announced.
//
// Input: one HTTP/1.1 request. Tokens "read-token", "write-token" (models "m*") and
// "admin-token" are configured. POST /v1/admin/backup is not run (it writes where it is told).
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "ckpt/api/api_handler.h"
#include "ckpt/api/auth.h"
#include "ckpt/base/safetensors.h"
#include "fuzz_support.h"

using namespace ckpt;
using namespace ckpt::api;
namespace http = boost::beast::http;

namespace {

struct Harness {
  std::filesystem::path dir;
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<ApiHandler> handler;
  std::unique_ptr<Authorizer> authorizer;
};

Harness* harness = nullptr;

std::string Body(float scale) {
  std::vector<float> weights(600), bias(8);  // weights: three chunks
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = scale * static_cast<float>(i % 7);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = scale / static_cast<float>(i + 1);
  auto as_bytes = [](const std::vector<float>& v) {
    return std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  return *WriteSafetensors({{"layer.weight", DType::kF32, {20, 30}, as_bytes(weights)},
                            {"layer.bias", DType::kF32, {8}, as_bytes(bias)}},
                           {{"metric.loss", "0.5"}});
}

void Seed(CheckpointStore& store) {
  auto lossy = CodecPolicy::FromJson(R"({"mode":"lossy","max_abs_error":0.01})", CodecPolicy());
  fuzz::Check(lossy.ok() && store.SetPolicy("mlossy", *lossy).ok(), "seeding a policy");
  for (const char* model : {"m", "mlossy", "other"}) {
    for (uint64_t v = 1; v <= 3; ++v) {
      const std::string body = Body(static_cast<float>(v));
      auto push = store.BeginPush(model, v * 10, body.size());
      fuzz::Check(push.ok(), "seeding: BeginPush");
      fuzz::Check((*push)->Write({reinterpret_cast<const uint8_t*>(body.data()), body.size()}).ok(),
                  "seeding: Write");
      fuzz::Check((*push)->Commit().ok(), "seeding: Commit");
    }
  }
  fuzz::Check(store.SetTag("m", "best", 20).ok(), "seeding a tag");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness = new Harness;
  std::string dir = (std::filesystem::temp_directory_path() / "ckpt-fuzz-http-XXXXXX").string();
  fuzz::Check(mkdtemp(dir.data()) != nullptr, "mkdtemp");
  harness->dir = dir;
  std::atexit([] { std::filesystem::remove_all(harness->dir); });
  StoreOptions options;
  options.data_dir = dir;
  options.chunk_bytes = 1024;  // the smallest allowed
  options.sync_commits = false;
  options.max_models = 64;
  options.max_tensors_per_checkpoint = 256;
  auto store = CheckpointStore::Open(options);
  fuzz::CheckStatusIn(store.status(), {}, "opening the store");
  harness->store = std::move(*store);
  Seed(*harness->store);
  harness->handler = std::make_unique<ApiHandler>(harness->store.get());
  auto grant = [](const char* name, const char* token, Scope scope, const char* prefix) {
    return TokenGrant{name, Authorizer::TokenDigestHex(token), scope, prefix};
  };
  auto authorizer = Authorizer::Create({grant("reader", "read-token", Scope::kRead, ""),
                                        grant("writer", "write-token", Scope::kWrite, "m"),
                                        grant("admin", "admin-token", Scope::kAdmin, "")});
  fuzz::Check(authorizer.ok(), "configuring tokens");
  harness->authorizer = std::make_unique<Authorizer>(std::move(*authorizer));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(16 << 10);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (!parser.is_done() && used < size) {
    const size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return 0;  // not a request the server would act on
    if (n == 0) break;
    used += n;
  }
  if (!parser.is_done()) {
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;
  }
  const auto& req = parser.get();
  const std::string method(req.method_string());
  Route route = ClassifyTarget(std::string_view(req.target().data(), req.target().size()));
  if (route.kind == RouteKind::kAdminBackup) return 0;

  const auto authorization = req[http::field::authorization];
  auto principal = harness->authorizer->Authorize(
      std::string_view(authorization.data(), authorization.size()), method, route);
  if (!principal.ok()) {
    fuzz::CheckStatusIn(principal.status(),
                        {StatusCode::kUnauthenticated, StatusCode::kPermissionDenied}, "Authorize");
    return 0;
  }
  route.model_prefix = principal->model_prefix;

  ApiResponse response;
  const std::string& body = req.body();
  switch (PlanOf(method, route)) {
    case RequestPlan::kPush: {
      std::optional<uint64_t> length;
      if (req.has_content_length()) length = body.size();
      auto session = harness->handler->BeginPush(route, length);
      if (!session.ok()) {
        response = ApiHandler::ErrorResponse(session.status());
        break;
      }
      const Status written =
          (*session)->Write({reinterpret_cast<const uint8_t*>(body.data()), body.size()});
      response = written.ok() ? harness->handler->FinishPush(**session)
                              : ApiHandler::ErrorResponse(written);
      break;
    }
    case RequestPlan::kRestore: {
      auto stream = harness->handler->OpenRestore(route);
      if (!stream.ok()) {
        response = ApiHandler::ErrorResponse(stream.status());
        break;
      }
      uint64_t streamed = 0;
      for (;;) {
        auto piece = (*stream)->Next();
        fuzz::Check(piece.ok(), "a restore failed midway");
        if (piece->empty()) break;
        streamed += piece->size();
      }
      fuzz::Check(streamed == (*stream)->size(), "a restore streamed another size than announced");
      break;
    }
    case RequestPlan::kSimple:
      response = harness->handler->Handle(method, route, body);
      break;
  }
  if (response.status >= 500 && response.status != 503) {
    std::fprintf(stderr, "%s %s -> %d %s\n", method.c_str(), std::string(req.target()).c_str(),
                 response.status, response.body.c_str());
    fuzz::Check(false, "a request was answered with a server error");
  }
  return 0;
}
