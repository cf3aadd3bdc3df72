#include "ckpt/client/client.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckpt/base/hashing.h"
#include "ckpt/base/model_name.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/version.h"
#include "error_response.h"
#include "put_stream.h"
#include "query_strings.h"
#include "server_url.h"

namespace ckpt {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

Status NetworkError(const beast::error_code& ec, std::string_view what) {
  return Status::Unavailable(std::string(what) + ": " + ec.message());
}

}  // namespace

// The TLS client context of an https:// Client: trusted CAs (ca_file, or the system's) and an
// optional client certificate.
struct TlsContext {
  net::ssl::context ssl{net::ssl::context::tls_client};
};

namespace {

// One connection to the daemon, plain or TLS. It is itself the stream Beast reads and writes
// (SyncReadStream and SyncWriteStream), so every request is written once for both.
class Connection {
 public:
  // The read buffer's spare capacity sizes each socket read (see api/src/server/session.cc).
  Connection() { buffer_.reserve(256 << 10); }

  // Connects to the first of `endpoints` that accepts (and, with TLS, completes a verified
  // handshake); the error of each attempt if none does.
  Status Connect(const std::vector<ServerEndpoint>& endpoints, TlsContext* tls) {
    std::string errors;
    for (const ServerEndpoint& e : endpoints) {
      tcp_.reset();
      tls_.reset();
      Status s = ConnectTo(e.host, e.port, tls);
      if (s.ok()) {
        host_ = e.host;
        return s;
      }
      if (endpoints.size() == 1) return s;
      errors += (errors.empty() ? "" : "; ") + s.message();
    }
    return Status::Unavailable("no server reachable: " + errors);
  }

  // The host connected to (for the Host header).
  const std::string& host() const { return host_; }

  Status ConnectTo(const std::string& host, const std::string& port, TlsContext* tls) {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host, port, ec);
    if (ec) return NetworkError(ec, "resolving " + host);
    beast::tcp_stream stream(ioc_);
    stream.connect(results, ec);
    if (ec) return NetworkError(ec, "connecting to " + host + ":" + port);
    stream.socket().set_option(tcp::no_delay(true), ec);  // header + body pieces: no Nagle stall
    if (!tls) {
      tcp_.emplace(std::move(stream));
      return Status::Ok();
    }
    tls_.emplace(std::move(stream), tls->ssl);
    // SNI, and the certificate must name the host we asked for.
    if (!SSL_set_tlsext_host_name(tls_->native_handle(), host.c_str())) {
      return Status::Unavailable("TLS: cannot set the server name " + host);
    }
    tls_->set_verify_callback(net::ssl::host_name_verification(host), ec);
    if (!ec) tls_->handshake(net::ssl::stream_base::client, ec);
    if (ec) return NetworkError(ec, "TLS handshake with " + host + ":" + port);
    return Status::Ok();
  }

  // SyncReadStream / SyncWriteStream.
  template <class Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& ec) {
    return tls_ ? tls_->read_some(buffers, ec) : tcp_->read_some(buffers, ec);
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers) {
    return tls_ ? tls_->read_some(buffers) : tcp_->read_some(buffers);
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers, beast::error_code& ec) {
    return tls_ ? tls_->write_some(buffers, ec) : tcp_->write_some(buffers, ec);
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers) {
    return tls_ ? tls_->write_some(buffers) : tcp_->write_some(buffers);
  }

  Connection& stream() { return *this; }
  beast::flat_buffer& buffer() { return buffer_; }

 private:
  net::io_context ioc_;
  std::string host_;
  std::optional<beast::tcp_stream> tcp_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buffer_;
};

// The headers every request carries: Host, User-Agent and, with a token, Authorization.
template <typename Request>
void SetCommonHeaders(Request& req, const std::string& host, const ClientOptions& options) {
  req.set(http::field::host, host);
  req.set(http::field::user_agent, std::string("ckpt/") + kVersionString);
  if (!options.token.empty()) req.set(http::field::authorization, "Bearer " + options.token);
}

Result<http::response<http::string_body>> SimpleRequest(
    const std::vector<ServerEndpoint>& servers, const ClientOptions& options, TlsContext* tls,
    http::verb verb, const std::string& target, std::string_view body,
    std::string_view content_type = "application/json") {
  std::vector<ServerEndpoint> endpoints = servers;
  for (int hop = 0;; ++hop) {
    Connection c;
    CKPT_RETURN_IF_ERROR(c.Connect(endpoints, tls));
    http::request<http::string_body> req{verb, target, 11};
    SetCommonHeaders(req, c.host(), options);
    if (!body.empty()) req.set(http::field::content_type, std::string(content_type));
    req.body() = std::string(body);
    req.prepare_payload();
    beast::error_code ec;
    http::write(c.stream(), req, ec);
    if (ec) return NetworkError(ec, "sending request");
    http::response<http::string_body> res;
    http::read(c.stream(), c.buffer(), res, ec);
    if (ec) return NetworkError(ec, "reading response");
    const unsigned status = res.result_int();
    if ((status != 307 && status != 308) || hop == kMaxRedirects) return res;
    const auto location = res[http::field::location];
    if (location.empty()) return res;
    CKPT_ASSIGN_OR_RETURN(ServerUrl next,
                          RedirectTarget(tls != nullptr, std::string(location), target));
    endpoints = {{next.host, next.port}};
  }
}

Result<json> JsonRequest(const std::vector<ServerEndpoint>& endpoints, const ClientOptions& options,
                         TlsContext* tls, http::verb verb, const std::string& target,
                         std::string_view body = {}) {
  CKPT_ASSIGN_OR_RETURN(auto res, SimpleRequest(endpoints, options, tls, verb, target, body));
  if (res.result_int() / 100 != 2) return ErrorFromResponse(res.result_int(), res.body());
  if (res.body().empty()) return json();
  json doc = json::parse(res.body(), nullptr, false);
  if (doc.is_discarded()) return Status::DataLoss("server sent invalid JSON");
  return doc;
}

ModelSummary ParseModel(const json& m) {
  ModelSummary s;
  s.name = m.value("name", "");
  if (m.contains("latest_version") && m["latest_version"].is_number()) {
    s.latest_version = m["latest_version"].get<uint64_t>();
  }
  s.version_count = m.value("version_count", uint64_t{0});
  s.raw_bytes = m.value("raw_bytes", uint64_t{0});
  s.stored_bytes = m.value("stored_bytes", uint64_t{0});
  return s;
}

// One attempt of StreamPut at host:port. A redirect announced instead of 100 Continue (no body
// byte sent) sets `location`.
Result<PutAnswer> StreamPutOnce(const std::vector<ServerEndpoint>& endpoints,
                                const ClientOptions& options, TlsContext* tls,
                                const std::string& target, const PutBody& body,
                                std::optional<std::string>* location) {
  Connection c;
  CKPT_RETURN_IF_ERROR(c.Connect(endpoints, tls));
  http::request<http::buffer_body> req{http::verb::put, target, 11};
  SetCommonHeaders(req, c.host(), options);
  req.set(http::field::content_type, std::string(body.content_type));
  req.set(http::field::expect, "100-continue");
  if (body.size) {
    req.content_length(*body.size);
  } else {
    req.chunked(true);
  }
  const ReadFn& read = body.read;
  req.body().data = nullptr;
  req.body().more = true;
  http::request_serializer<http::buffer_body> sr{req};
  beast::error_code ec;
  http::write_header(c.stream(), sr, ec);
  if (ec) return NetworkError(ec, "sending request header");

  // The server answers 100 Continue, or refuses at once (bad name, stale version, too large).
  http::response<http::string_body> res;
  {
    http::response_parser<http::string_body> interim;
    http::read_header(c.stream(), c.buffer(), interim, ec);
    if (ec) return NetworkError(ec, "reading server reply");
    if (interim.get().result() != http::status::continue_) {
      http::read(c.stream(), c.buffer(), interim, ec);
      const unsigned status = interim.get().result_int();
      const auto to = interim.get()[http::field::location];
      if ((status == 307 || status == 308) && !to.empty()) *location = std::string(to);
      return ErrorFromResponse(status, interim.get().body());
    }
  }

  std::vector<char> buffer(options.io_buffer_bytes);
  uint64_t sent = 0;
  while (!body.size || sent < *body.size) {
    CKPT_ASSIGN_OR_RETURN(size_t n, read(buffer.data(), buffer.size()));
    if (n == 0 && !body.size) break;  // the end of a body of unknown size
    if (n == 0) return Status::IoError("input ended after " + std::to_string(sent) + " bytes");
    req.body().data = buffer.data();
    req.body().size = n;
    req.body().more = true;
    http::write(c.stream(), sr, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      // The server may have refused mid-body (malformed checkpoint); show its reason.
      beast::error_code read_ec;
      http::read(c.stream(), c.buffer(), res, read_ec);
      if (!read_ec) return ErrorFromResponse(res.result_int(), res.body());
      return NetworkError(ec, "sending body");
    }
    sent += n;
    if (options.progress) options.progress(sent, body.size.value_or(0));
  }
  req.body().data = nullptr;
  req.body().size = 0;
  req.body().more = false;
  http::write(c.stream(), sr, ec);
  if (ec == http::error::need_buffer) ec = {};
  http::read(c.stream(), c.buffer(), res, ec);
  if (ec) return NetworkError(ec, "reading response");
  if (res.result_int() / 100 != 2) return ErrorFromResponse(res.result_int(), res.body());
  PutAnswer answer{res.result_int(), json::parse(res.body(), nullptr, false)};
  if (answer.body.is_discarded()) return Status::DataLoss("server sent invalid JSON");
  return answer;
}

Result<PushResult> StreamPush(const std::vector<ServerEndpoint>& servers,
                              const ClientOptions& options, TlsContext* tls, std::string_view model,
                              uint64_t version, const PushMetadata& metadata, uint64_t size,
                              const ReadFn& read) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  const std::string target = VersionTarget(model, std::to_string(version)) + PushQuery(metadata);
  CKPT_ASSIGN_OR_RETURN(PutAnswer answer, StreamPut(servers, options, tls, target, {size, read}));
  if (answer.status != 201) return ErrorFromResponse(answer.status, answer.body.dump());
  PushResult result = PushResultFromJson(answer.body);
  result.sent_bytes = size;
  return result;
}

using WriteFn = std::function<Status(const char* data, size_t n)>;

// Where a pull resumes: the bytes already received of the body whose ETag is `etag`, and their
// SHA-256 so far. `past_end` is set when the server refused the range as past the body's end
// (the earlier pull received every byte but stopped before renaming).
struct ResumePoint {
  uint64_t bytes = 0;
  std::string etag;
  std::unique_ptr<Sha256> hash;
  bool past_end = false;
};

// Called once the answer's header is in, before the first byte is written: `start` is where the
// body sent begins (0, or the resume point's bytes when the server sends the rest) and `etag`
// the whole body's ETag (empty if none).
using BeginFn = std::function<Status(uint64_t start, const std::string& etag)>;

Result<PullResult> StreamGetFrom(const std::vector<ServerEndpoint>& endpoints,
                                 const ClientOptions& options, TlsContext* tls,
                                 const std::string& target, std::string_view accept,
                                 const WriteFn& write, ResumePoint* resume = nullptr,
                                 const BeginFn& begin = nullptr) {
  Connection c;
  CKPT_RETURN_IF_ERROR(c.Connect(endpoints, tls));
  http::request<http::empty_body> req{http::verb::get, target, 11};
  SetCommonHeaders(req, c.host(), options);
  if (!accept.empty()) req.set(http::field::accept, std::string(accept));
  if (resume != nullptr) {
    // The rest of the body, if it is still the one whose start we hold; else the whole body.
    req.set(http::field::range, "bytes=" + std::to_string(resume->bytes) + "-");
    req.set(http::field::if_range, resume->etag);
  }
  beast::error_code ec;
  http::write(c.stream(), req, ec);
  if (ec) return NetworkError(ec, "sending request");

  http::response_parser<http::buffer_body> parser;
  // Beast 1.74 compares the length against an empty optional as "exceeded"; use a maximum.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read_header(c.stream(), c.buffer(), parser, ec);
  if (ec) return NetworkError(ec, "reading response header");
  std::vector<char> buffer(options.io_buffer_bytes);
  const unsigned status = parser.get().result_int();
  if (status == 416 && resume != nullptr) resume->past_end = true;
  if (status != 200 && !(status == 206 && resume != nullptr)) {
    std::string body;
    while (!parser.is_done()) {
      parser.get().body().data = buffer.data();
      parser.get().body().size = buffer.size();
      http::read(c.stream(), c.buffer(), parser, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) break;
      body.append(buffer.data(), buffer.size() - parser.get().body().size);
    }
    return ErrorFromResponse(status, body);
  }
  PullResult result;
  std::unique_ptr<Sha256> sha = std::make_unique<Sha256>();
  if (status == 206) {
    const std::string range(parser.get()[http::field::content_range]);
    const std::string expected = "bytes " + std::to_string(resume->bytes) + "-";
    if (range.compare(0, expected.size(), expected) != 0) {
      return Status::DataLoss("the server resumed at '" + range + "', not at byte " +
                              std::to_string(resume->bytes));
    }
    sha = std::move(resume->hash);
    result.resumed_bytes = resume->bytes;
    result.bytes = resume->bytes;
  }
  const std::string expected_sha(parser.get()["X-Ckpt-Sha256"]);
  const std::string version_header(parser.get()["X-Ckpt-Version"]);
  result.version = version_header.empty() ? 0 : std::stoull(version_header);
  const uint64_t total = result.bytes + parser.content_length().value_or(0);
  if (begin) {
    CKPT_RETURN_IF_ERROR(begin(result.bytes, std::string(parser.get()[http::field::etag])));
  }
  while (!parser.is_done()) {
    parser.get().body().data = buffer.data();
    parser.get().body().size = buffer.size();
    http::read(c.stream(), c.buffer(), parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    // Bytes that arrived before an error are kept too: a resumed pull continues after them.
    const size_t n = buffer.size() - parser.get().body().size;
    sha->Update(std::string_view(buffer.data(), n));
    CKPT_RETURN_IF_ERROR(write(buffer.data(), n));
    result.bytes += n;
    if (ec) {
      return Status::Unavailable("download interrupted after " + std::to_string(result.bytes) +
                                 " of " + std::to_string(total) + " bytes: " + ec.message());
    }
    if (options.progress) options.progress(result.bytes, total);
  }
  result.sha256 = sha->FinishHex();
  if (!expected_sha.empty() && expected_sha != result.sha256) {
    return Status::DataLoss("downloaded body SHA-256 " + result.sha256 +
                            " differs from the server's " + expected_sha);
  }
  result.verified = !expected_sha.empty();
  return result;
}

Result<PullResult> StreamPull(const std::vector<ServerEndpoint>& endpoints,
                              const ClientOptions& options, TlsContext* tls, std::string_view model,
                              std::string_view version, const WriteFn& write,
                              const PullOptions& part = {}, ResumePoint* resume = nullptr,
                              const BeginFn& begin = nullptr) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  const std::string target =
      part.hf_file.empty() ? VersionTarget(model, version) + PullQuery(part)
                           : VersionTarget(model, version) + "/hf/" + QueryEscape(part.hf_file) +
                                 "?max_shard_bytes=" + std::to_string(part.hf_max_file_bytes);
  return StreamGetFrom(endpoints, options, tls, target, {}, write, resume, begin);
}

// The resume point of an earlier pull into `partial` whose body's ETag is in `etag_file`; null
// if there is none (or it cannot be read: the pull then starts over).
std::unique_ptr<ResumePoint> ReadResumePoint(const std::string& partial,
                                             const std::string& etag_file) {
  std::ifstream etag_in(etag_file);
  std::string etag;
  if (!etag_in || !std::getline(etag_in, etag) || etag.empty()) return nullptr;
  std::ifstream in(partial, std::ios::binary);
  if (!in) return nullptr;
  auto point = std::make_unique<ResumePoint>();
  point->etag = etag;
  point->hash = std::make_unique<Sha256>();
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    point->hash->Update(std::string_view(buffer.data(), n));
    point->bytes += n;
  }
  if (!in.eof() || point->bytes == 0) return nullptr;
  return point;
}

}  // namespace

std::string VersionTarget(std::string_view model, std::string_view version) {
  return "/v1/models/" + std::string(model) + "/versions/" + std::string(version);
}

Result<PutAnswer> StreamPut(const std::vector<ServerEndpoint>& servers,
                            const ClientOptions& options, TlsContext* tls,
                            const std::string& target, const PutBody& body) {
  std::vector<ServerEndpoint> endpoints = servers;
  for (int hop = 0;; ++hop) {
    std::optional<std::string> location;
    auto answer = StreamPutOnce(endpoints, options, tls, target, body, &location);
    if (!location || hop == kMaxRedirects) return answer;
    CKPT_ASSIGN_OR_RETURN(ServerUrl next, RedirectTarget(tls != nullptr, *location, target));
    endpoints = {{next.host, next.port}};
  }
}

Result<PullResult> StreamGet(const std::vector<ServerEndpoint>& servers,
                             const ClientOptions& options, TlsContext* tls,
                             const std::string& target, std::string_view accept,
                             const std::function<Status(const char*, size_t)>& write) {
  return StreamGetFrom(servers, options, tls, target, accept, write);
}

Result<json> PostForJson(const std::vector<ServerEndpoint>& servers, const ClientOptions& options,
                         TlsContext* tls, const std::string& target, std::string_view body,
                         std::string_view content_type) {
  CKPT_ASSIGN_OR_RETURN(
      auto res, SimpleRequest(servers, options, tls, http::verb::post, target, body, content_type));
  if (res.result_int() / 100 != 2) return ErrorFromResponse(res.result_int(), res.body());
  json doc = json::parse(res.body(), nullptr, false);
  if (doc.is_discarded()) return Status::DataLoss("server sent invalid JSON");
  return doc;
}

Result<SafetensorsHeader> ReadSafetensorsFileHeader(std::istream& in, uint64_t size) {
  char prefix[8];
  if (size < 8 || !in.read(prefix, 8)) {
    return Status::InvalidArgument("not a safetensors file: shorter than 8 bytes");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[i]);
  if (n > kMaxSafetensorsHeaderBytes || n > size - 8) {
    return Status::InvalidArgument("not a safetensors file: header length " + std::to_string(n) +
                                   " is larger than the file or the 100 MB limit");
  }
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) {
    return Status::IoError("cannot read the safetensors header");
  }
  return ParseSafetensorsHeader(header, size);
}

PushResult PushResultFromJson(const json& doc) {
  PushResult r;
  r.model = doc.value("model", "");
  r.version = doc.value("version", uint64_t{0});
  r.kind = doc.value("kind", "");
  r.raw_bytes = doc.value("raw_bytes", uint64_t{0});
  r.stored_bytes = doc.value("stored_bytes", uint64_t{0});
  r.sha256 = doc.value("sha256", "");
  r.pushed_sha256 = doc.value("pushed_sha256", "");
  r.lossy = doc.value("lossy", false);
  r.created_at = doc.value("created_at", "");
  r.tensor_count = doc.value("tensor_count", uint32_t{0});
  r.tags = doc.value("tags", std::vector<std::string>{});
  r.metrics = doc.value("metrics", std::map<std::string, double>{});
  r.labels = doc.value("labels", std::map<std::string, std::string>{});
  return r;
}

Result<Client> Client::Create(ClientOptions options) {
  std::vector<ServerEndpoint> endpoints;
  bool https = false;
  std::string_view list = options.server;
  for (size_t i = 0; list.size() > 0; ++i) {
    const size_t comma = list.find(',');
    CKPT_ASSIGN_OR_RETURN(const ServerUrl parsed, ParseServerUrl(list.substr(0, comma), false));
    if (i == 0) https = parsed.https;
    if (parsed.https != https) {
      return Status::InvalidArgument("server URLs '" + options.server +
                                     "' mix http:// and https://");
    }
    endpoints.push_back({parsed.host, parsed.port});
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
    if (list.empty()) return Status::InvalidArgument("server URLs end with a comma");
  }
  if (endpoints.empty()) return Status::InvalidArgument("no server URL given");
  std::shared_ptr<TlsContext> tls;
  if (https) {
    tls = std::make_shared<TlsContext>();
    beast::error_code ec;
    if (options.ca_file.empty()) {
      tls->ssl.set_default_verify_paths(ec);
    } else {
      tls->ssl.load_verify_file(options.ca_file, ec);
    }
    if (ec) {
      return Status::InvalidArgument("CA file '" + options.ca_file + "': " + ec.message());
    }
    tls->ssl.set_verify_mode(net::ssl::verify_peer);
    if (!options.client_cert_file.empty()) {
      tls->ssl.use_certificate_chain_file(options.client_cert_file, ec);
      if (!ec) {
        tls->ssl.use_private_key_file(options.client_key_file, net::ssl::context::pem, ec);
      }
      if (ec) return Status::InvalidArgument("client certificate or key: " + ec.message());
    }
  } else if (!options.ca_file.empty() || !options.client_cert_file.empty()) {
    return Status::InvalidArgument("TLS files given for a plain http:// server URL");
  }
  return Client(std::move(options), std::move(endpoints), std::move(tls));
}

Result<PushResult> Client::PushFile(std::string_view model, uint64_t version,
                                    const std::string& path, const PushMetadata& metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open '" + path + "'");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return Status::IoError("cannot stat '" + path + "': " + ec.message());
  // Validate the header locally first: a malformed file is reported precisely without
  // uploading gigabytes the server would refuse.
  CKPT_RETURN_IF_ERROR(ReadSafetensorsFileHeader(in, size).status().WithContext("'" + path + "'"));
  in.seekg(0);
  return StreamPush(endpoints_, options_, tls_.get(), model, version, metadata, size,
                    [&](char* buffer, size_t capacity) -> Result<size_t> {
                      in.read(buffer, static_cast<std::streamsize>(capacity));
                      if (in.bad()) return Status::IoError("reading '" + path + "' failed");
                      return static_cast<size_t>(in.gcount());
                    });
}

Result<PushResult> Client::PushBuffer(std::string_view model, uint64_t version,
                                      std::string_view body, const PushMetadata& metadata) {
  size_t offset = 0;
  return StreamPush(endpoints_, options_, tls_.get(), model, version, metadata, body.size(),
                    [&](char* buffer, size_t capacity) -> Result<size_t> {
                      const size_t n = std::min(capacity, body.size() - offset);
                      std::memcpy(buffer, body.data() + offset, n);
                      offset += n;
                      return n;
                    });
}

Result<PullResult> Client::PullToFile(std::string_view model, std::string_view version,
                                      const std::string& path, const PullOptions& part) {
  if (path == "-") {
    return StreamPull(
        endpoints_, options_, tls_.get(), model, version,
        [](const char* d, size_t n) {
          std::cout.write(d, static_cast<std::streamsize>(n));
          return std::cout ? Status::Ok() : Status::IoError("writing to stdout failed");
        },
        part);
  }
  const std::string partial = path + ".partial";
  const std::string etag_file = partial + ".etag";
  const bool whole = part.tensors.empty() && part.ranks == 0 && part.hf_file.empty();
  std::unique_ptr<ResumePoint> resume = whole ? ReadResumePoint(partial, etag_file) : nullptr;
  std::ofstream out;
  const auto begin = [&](uint64_t start, const std::string& etag) -> Status {
    out.open(partial, std::ios::binary | (start > 0 ? std::ios::app : std::ios::trunc));
    if (!out) return Status::IoError("cannot write '" + partial + "'");
    if (!whole || etag.empty()) return Status::Ok();
    std::ofstream etag_out(etag_file, std::ios::trunc);
    etag_out << etag << "\n";
    return etag_out ? Status::Ok() : Status::IoError("cannot write '" + etag_file + "'");
  };
  const auto attempt = [&]() -> Result<PullResult> {
    CKPT_ASSIGN_OR_RETURN(auto r,
                          StreamPull(
                              endpoints_, options_, tls_.get(), model, version,
                              [&](const char* d, size_t n) {
                                out.write(d, static_cast<std::streamsize>(n));
                                return out ? Status::Ok()
                                           : Status::IoError("writing '" + partial + "' failed");
                              },
                              part, resume.get(), begin));
    out.close();
    if (!out) return Status::IoError("closing '" + partial + "' failed");
    return r;
  };
  Result<PullResult> result = attempt();
  if (!result.ok() && resume && resume->past_end) {
    resume.reset();  // nothing is left to resume: the whole body again, verified as a whole
    result = attempt();
  }
  std::error_code ec;
  if (!result.ok()) {
    out.close();
    const bool resumable = whole && result.status().code() == StatusCode::kUnavailable &&
                           std::filesystem::exists(etag_file, ec);
    if (resumable) {
      return Status::Unavailable(result.status().message() + "; kept '" + partial +
                                 "': the same pull resumes it");
    }
    std::filesystem::remove(partial, ec);
    std::filesystem::remove(etag_file, ec);
    return result;
  }
  std::filesystem::remove(etag_file, ec);
  std::filesystem::rename(partial, path, ec);
  if (ec) return Status::IoError("renaming '" + partial + "': " + ec.message());
  return result;
}

Result<std::string> Client::PullToBuffer(std::string_view model, std::string_view version) {
  std::string out;
  CKPT_RETURN_IF_ERROR(
      StreamPull(endpoints_, options_, tls_.get(), model, version, [&](const char* d, size_t n) {
        out.append(d, n);
        return Status::Ok();
      }).status());
  return out;
}

Result<std::vector<std::string>> Client::PullHfDir(std::string_view model, std::string_view version,
                                                   const std::string& dir,
                                                   uint64_t max_file_bytes) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  CKPT_ASSIGN_OR_RETURN(
      json index, JsonRequest(endpoints_, options_, tls_.get(), http::verb::get,
                              VersionTarget(model, version) + "/hf/model.safetensors.index.json" +
                                  "?max_shard_bytes=" + std::to_string(max_file_bytes)));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create '" + dir + "': " + ec.message());
  // The files of the version the index is of ("latest" may move on meanwhile).
  const json metadata = index.value("metadata", json::object());
  if (!metadata.is_object() || !metadata.value("version", json()).is_number_unsigned()) {
    return Status::DataLoss("the server's index names no version");
  }
  const std::string number = std::to_string(metadata["version"].get<uint64_t>());
  std::vector<std::string> written = {dir + "/model.safetensors.index.json"};
  {
    std::ofstream out(written[0], std::ios::binary | std::ios::trunc);
    out << index.dump(2) << "\n";
    if (!out) return Status::IoError("writing '" + written[0] + "' failed");
  }
  std::set<std::string> files;
  const json weight_map = index.value("weight_map", json::object());
  for (const auto& [tensor, file] : weight_map.items()) {
    const std::string name = file.is_string() ? file.get<std::string>() : std::string();
    if (name.find('/') != std::string::npos || name.empty() || name[0] == '.') {
      return Status::DataLoss("the server's index names a file '" + name + "'");
    }
    files.insert(name);
  }
  for (const std::string& file : files) {
    PullOptions part;
    part.hf_file = file;
    part.hf_max_file_bytes = max_file_bytes;
    CKPT_RETURN_IF_ERROR(PullToFile(model, number, dir + "/" + file, part).status());
    written.push_back(dir + "/" + file);
  }
  return written;
}

Result<uint64_t> Client::ResolveVersion(std::string_view model, std::string_view version) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  if (version == "latest") {
    CKPT_ASSIGN_OR_RETURN(ModelSummary summary, GetModel(model));
    if (!summary.latest_version) {
      return Status::NotFound("model '" + std::string(model) + "' has no versions");
    }
    return *summary.latest_version;
  }
  if (version.starts_with("tag:")) {
    const std::string_view tag = version.substr(4);
    CKPT_ASSIGN_OR_RETURN(std::vector<VersionSummary> versions, ListVersions(model));
    for (const VersionSummary& v : versions) {
      if (std::find(v.tags.begin(), v.tags.end(), tag) != v.tags.end()) return v.version;
    }
    return Status::NotFound("model '" + std::string(model) + "' has no version tagged '" +
                            std::string(tag) + "'");
  }
  if (version.empty() || version.size() > 20 ||
      version.find_first_not_of("0123456789") != std::string_view::npos) {
    return Status::InvalidArgument("version '" + std::string(version.substr(0, 40)) +
                                   "' must be a decimal number, 'latest' or 'tag:NAME'");
  }
  return std::stoull(std::string(version));
}

Result<std::vector<ModelSummary>> Client::ListModels() {
  CKPT_ASSIGN_OR_RETURN(
      json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::get, "/v1/models"));
  std::vector<ModelSummary> out;
  for (const auto& m : doc.value("models", json::array())) out.push_back(ParseModel(m));
  return out;
}

Result<ModelSummary> Client::GetModel(std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::get,
                                              "/v1/models/" + std::string(model)));
  return ParseModel(doc);
}

Result<std::vector<VersionSummary>> Client::ListVersions(std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::get,
                                              "/v1/models/" + std::string(model) + "/versions"));
  std::vector<VersionSummary> out;
  for (const auto& v : doc.value("versions", json::array())) {
    VersionSummary s;
    s.version = v.value("version", uint64_t{0});
    s.kind = v.value("kind", "");
    s.raw_bytes = v.value("raw_bytes", uint64_t{0});
    s.stored_bytes = v.value("stored_bytes", uint64_t{0});
    s.created_at = v.value("created_at", "");
    s.sha256 = v.value("sha256", "");
    s.lossy = v.value("lossy", false);
    s.dropped_tensors = v.value("dropped_tensors", uint32_t{0});
    s.pushed_sha256 = v.value("pushed_sha256", "");
    s.tensor_count = v.value("tensor_count", uint32_t{0});
    const json labels = v.value("labels", json::object());
    for (const auto& [name, value] : labels.items()) {
      if (value.is_string()) s.labels[name] = value.get<std::string>();
    }
    const json tags = v.value("tags", json::array());
    for (const auto& tag : tags) {
      if (tag.is_string()) s.tags.push_back(tag.get<std::string>());
    }
    const json metrics = v.value("metrics", json::object());
    for (const auto& [name, value] : metrics.items()) {
      if (value.is_number()) s.metrics[name] = value.get<double>();
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<std::string> Client::VersionDetail(std::string_view model, uint64_t version) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(model));
  CKPT_ASSIGN_OR_RETURN(json doc,
                        JsonRequest(endpoints_, options_, tls_.get(), http::verb::get,
                                    VersionTarget(model, std::to_string(version)) + "?detail=1"));
  return doc.dump();
}

Status Client::DeleteVersion(std::string_view model, uint64_t version) {
  return JsonRequest(endpoints_, options_, tls_.get(), http::verb::delete_,
                     VersionTarget(model, std::to_string(version)))
      .status();
}

Status Client::DeleteModel(std::string_view model) {
  return JsonRequest(endpoints_, options_, tls_.get(), http::verb::delete_,
                     "/v1/models/" + std::string(model))
      .status();
}

Result<std::string> Client::GetPolicy(std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::get,
                                              "/v1/models/" + std::string(model) + "/policy"));
  return doc.dump();
}

Result<std::string> Client::SetPolicy(std::string_view model, std::string_view policy_json) {
  CKPT_ASSIGN_OR_RETURN(json doc,
                        JsonRequest(endpoints_, options_, tls_.get(), http::verb::put,
                                    "/v1/models/" + std::string(model) + "/policy", policy_json));
  return doc.dump();
}

Status Client::SetTag(std::string_view model, uint64_t version, std::string_view tag) {
  return JsonRequest(endpoints_, options_, tls_.get(), http::verb::put,
                     VersionTarget(model, std::to_string(version)) + "/tags/" + std::string(tag))
      .status();
}

Status Client::RemoveTag(std::string_view model, uint64_t version, std::string_view tag) {
  return JsonRequest(endpoints_, options_, tls_.get(), http::verb::delete_,
                     VersionTarget(model, std::to_string(version)) + "/tags/" + std::string(tag))
      .status();
}

Result<std::string> Client::GetRetention(std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::get,
                                              "/v1/models/" + std::string(model) + "/retention"));
  return doc.dump();
}

Result<std::string> Client::SetRetention(std::string_view model, std::string_view policy_json) {
  CKPT_ASSIGN_OR_RETURN(
      json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::put,
                            "/v1/models/" + std::string(model) + "/retention", policy_json));
  return doc.dump();
}

Result<std::string> Client::ApplyRetention(std::string_view model, bool dry_run,
                                           std::string_view policy_json) {
  const std::string target =
      "/v1/models/" + std::string(model) + (dry_run ? "/retention:preview" : "/retention:apply");
  CKPT_ASSIGN_OR_RETURN(json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::post,
                                              target, policy_json));
  return doc.dump();
}

Result<std::string> Client::CollectGarbage() {
  CKPT_ASSIGN_OR_RETURN(
      json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::post, "/v1/admin/gc"));
  return doc.dump();
}

Result<std::string> Client::Scrub() {
  CKPT_ASSIGN_OR_RETURN(
      json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::post, "/v1/admin/scrub"));
  return doc.dump();
}

Result<std::string> Client::Backup(std::string_view dir) {
  CKPT_ASSIGN_OR_RETURN(
      json doc, JsonRequest(endpoints_, options_, tls_.get(), http::verb::post, "/v1/admin/backup",
                            json{{"to", std::string(dir)}}.dump()));
  return doc.dump();
}

}  // namespace ckpt
