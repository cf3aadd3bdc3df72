// Streaming transfers shared by the client's calls — PUTs of request bodies (whole, sharded and
// encoded pushes), GETs of response bodies — and the local check of a file before it is sent.
// Internal to client-lib.
#pragma once

#include <cstdint>
#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/client/client.h"

namespace ckpt {

// A source of body bytes: fills up to `capacity` bytes, 0 at the end.
using ReadFn = std::function<Result<size_t>(char* buffer, size_t capacity)>;

// A 2xx answer to a PUT and its JSON body.
struct PutAnswer {
  unsigned status = 0;
  nlohmann::json body;
};

// "/v1/models/{model}/versions/{version}".
std::string VersionTarget(std::string_view model, std::string_view version);

// A request body streamed from `read`: `size` bytes (Content-Length), or, without a size,
// chunked until `read` returns 0.
struct PutBody {
  std::optional<uint64_t> size;
  ReadFn read;
  std::string_view content_type = "application/octet-stream";
};

// PUTs `body` to `target` with Expect: 100-continue, following redirects the server announces
// before the body (each daemon of a deployment sends writes to the model's writer). Reports
// progress through options.progress. Non-2xx answers are their Status.
Result<PutAnswer> StreamPut(const std::vector<ServerEndpoint>& servers,
                            const ClientOptions& options, TlsContext* tls,
                            const std::string& target, const PutBody& body);

// GETs `target` (with `accept` as the Accept header, when not empty) and hands the body to
// `write` as it arrives; PullResult::verified when the server announced its SHA-256 and it
// matched. Non-2xx answers are their Status.
Result<PullResult> StreamGet(const std::vector<ServerEndpoint>& servers,
                             const ClientOptions& options, TlsContext* tls,
                             const std::string& target, std::string_view accept,
                             const std::function<Status(const char*, size_t)>& write);

// POSTs a small `body` of `content_type` to `target` and returns the JSON answer; non-2xx
// answers are their Status.
Result<nlohmann::json> PostForJson(const std::vector<ServerEndpoint>& servers,
                                   const ClientOptions& options, TlsContext* tls,
                                   const std::string& target, std::string_view body,
                                   std::string_view content_type);

// The header of the safetensors file `in` (at its start) of `size` bytes, validated locally so that
// a malformed file is reported precisely without uploading what the server would refuse.
Result<SafetensorsHeader> ReadSafetensorsFileHeader(std::istream& in, uint64_t size);

// The version a push (or the shard that committed a version) answers.
PushResult PushResultFromJson(const nlohmann::json& version);

}  // namespace ckpt
