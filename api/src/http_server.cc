// Boost.Beast sessions for the ckptd API. Structure follows Beast's advanced server example:
// a listener coroutine accepts; each connection runs a session coroutine on its own strand;
// every safety limit is a named option in HttpServerOptions.
#include "ckpt/api/http_server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <span>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckpt/api/api_handler.h"
#include "ckpt/version.h"
#include "model_turns.h"
#include "pooled_call.h"
#include "request_log.h"
#include "tls_context.h"

namespace ckpt::api {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr auto kUseAwaitable = net::use_awaitable;
// Capacity of each connection's read buffer, and so the largest single socket read.
constexpr size_t kReadBufferBytes = 256 << 10;

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(const HttpServerOptions& options, CheckpointStore* store)
      : options_(options),
        handler_(store, options.on_versions_changed),
        acceptor_(net::make_strand(ioc_)) {}

  ~HttpServerImpl() override { Shutdown(); }

  Status Listen() {
    CKPT_ASSIGN_OR_RETURN(tls_, NewTlsContext(options_));
    beast::error_code ec;
    auto address = net::ip::make_address(options_.address, ec);
    if (ec) return Status::InvalidArgument("invalid listen address '" + options_.address + "'");
    tcp::endpoint endpoint(address, options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status::Unavailable("cannot listen on " + options_.address + ":" +
                                 std::to_string(options_.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    net::co_spawn(acceptor_.get_executor(), AcceptLoop(), net::detached);
    const int threads = std::max(1, options_.threads);
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { ioc_.run(); });
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  void Shutdown() override {
    if (stopping_.exchange(true)) {
      Join();
      return;
    }
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
    CloseIdleSessions();
    turns_.Stop();  // a request waiting for a busy model answers now
    {
      std::unique_lock lock(sessions_mu_);
      sessions_cv_.wait_for(lock, options_.shutdown_grace, [this] { return sessions_.empty(); });
      if (!sessions_.empty()) {
        spdlog::warn("shutdown: {} connection(s) still busy after {}s, cutting them",
                     sessions_.size(), options_.shutdown_grace.count());
      }
    }
    ioc_.stop();
    Join();
    admin_pool_.join();   // an administrative pass in progress finishes first
    commit_pool_.join();  // and so does a commit
  }

 private:
  struct SessionEntry {
    beast::tcp_stream* stream;
    bool busy;
  };

  // Registers a session for shutdown bookkeeping; unregisters on destruction.
  class SessionRegistration {
   public:
    SessionRegistration(HttpServerImpl* server, beast::tcp_stream* stream)
        : server_(server), id_(server->next_session_id_++) {
      std::lock_guard lock(server_->sessions_mu_);
      server_->sessions_.emplace(id_, SessionEntry{stream, false});
    }
    ~SessionRegistration() {
      std::lock_guard lock(server_->sessions_mu_);
      server_->sessions_.erase(id_);
      server_->sessions_cv_.notify_all();
    }
    void SetBusy(bool busy) {
      std::lock_guard lock(server_->sessions_mu_);
      server_->sessions_.at(id_).busy = busy;
    }

   private:
    HttpServerImpl* server_;
    uint64_t id_;
  };

  void Join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  void CloseIdleSessions() {
    std::lock_guard lock(sessions_mu_);
    for (auto& [id, entry] : sessions_) {
      if (entry.busy) continue;
      // Runs on the session's strand. The session may have ended (and freed its stream) before
      // this runs; it deregisters on that same strand, so finding it registered means it lives.
      net::post(entry.stream->get_executor(), [this, session_id = id] {
        std::lock_guard inner(sessions_mu_);
        auto it = sessions_.find(session_id);
        if (it == sessions_.end() || it->second.busy) return;
        beast::error_code ignored;
        it->second.stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
        it->second.stream->socket().close(ignored);
      });
    }
  }

  bool AtConnectionLimit() {
    if (options_.max_connections == 0) return false;
    std::lock_guard lock(sessions_mu_);
    return sessions_.size() >= options_.max_connections;
  }

  // Over max_connections: a plain-HTTP client gets a 503 (best effort, without reading its
  // request), a TLS client a closed connection; either way the connection ends at once.
  void RefuseConnection(tcp::socket socket) {
    spdlog::warn("{} refused: {} connections open (server.max_connections)", RemoteOf(socket),
                 options_.max_connections);
    if (!tls_) {
      static const std::string kBusy = [] {
        const ApiResponse busy = ApiHandler::ErrorResponse(
            Status::Unavailable("too many connections; retry in a moment"));
        http::response<http::string_body> res{static_cast<http::status>(busy.status), 11};
        res.set(http::field::connection, "close");
        res.set(http::field::content_type, busy.content_type);
        res.set(http::field::retry_after, "1");
        res.body() = busy.body;
        res.prepare_payload();
        std::ostringstream out;
        out << res;
        return out.str();
      }();
      beast::error_code ec;
      socket.non_blocking(true, ec);
      socket.write_some(net::buffer(kBusy), ec);  // a fresh socket's send buffer takes it
    }
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }

  net::awaitable<void> AcceptLoop() {
    for (;;) {
      beast::error_code ec;
      tcp::socket socket = co_await acceptor_.async_accept(net::make_strand(ioc_),
                                                           net::redirect_error(kUseAwaitable, ec));
      if (ec) {
        if (stopping_ || ec == net::error::operation_aborted) co_return;
        spdlog::warn("accept failed: {}", ec.message());
        continue;
      }
      // Responses are written as a header followed by body pieces; without TCP_NODELAY, Nagle's
      // algorithm meets the client's delayed ACK and stalls each response by ~40 ms.
      socket.set_option(tcp::no_delay(true), ec);
      if (AtConnectionLimit()) {
        RefuseConnection(std::move(socket));
        continue;
      }
      auto executor = socket.get_executor();
      if (tls_) {
        net::co_spawn(executor, TlsSession(std::move(socket)), LogEscapedException);
      } else {
        net::co_spawn(executor, Session(std::move(socket)), LogEscapedException);
      }
    }
  }

  static std::string RemoteOf(const tcp::socket& socket) {
    beast::error_code ec;
    auto endpoint = socket.remote_endpoint(ec);
    return ec ? std::string("?")
              : endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
  }

  net::awaitable<void> Session(tcp::socket socket) {
    const std::string remote = RemoteOf(socket);
    beast::tcp_stream stream(std::move(socket));
    co_await Serve(stream, remote);
  }

  // HTTPS: the TLS handshake (bounded by io_timeout), then the same sessions as plain HTTP.
  net::awaitable<void> TlsSession(tcp::socket socket) {
    const std::string remote = RemoteOf(socket);
    beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), *tls_);
    beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
    beast::error_code ec;
    co_await stream.async_handshake(net::ssl::stream_base::server,
                                    net::redirect_error(kUseAwaitable, ec));
    if (ec) {
      spdlog::info("{} TLS handshake failed: {}", remote, ec.message());
      co_return;
    }
    co_await Serve(stream, remote);
  }

  // The request loop of one connection, over a plain or TLS stream.
  template <class Stream>
  net::awaitable<void> Serve(Stream& stream, const std::string& remote) {
    SessionRegistration registration(this, &beast::get_lowest_layer(stream));
    beast::flat_buffer buffer;
    // Beast sizes each socket read by the buffer's spare capacity; without a reserve a body
    // arrives in ~1.5 KB reads, each a coroutine resumption.
    buffer.reserve(kReadBufferBytes);
    for (;;) {
      if (stopping_) break;
      http::request_parser<http::buffer_body> parser;
      parser.header_limit(options_.max_header_bytes);
      // Body sizes are enforced per route (HandlePush, ReadSmallBody) so that an oversized
      // request still gets its 413 answer instead of a dropped connection.
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      beast::get_lowest_layer(stream).expires_after(options_.idle_timeout);
      beast::error_code ec;
      co_await http::async_read_header(stream, buffer, parser,
                                       net::redirect_error(kUseAwaitable, ec));
      if (ec == http::error::header_limit) {
        RequestLog log;
        log.method = log.target = "?";
        log.status = 431;
        ApiResponse r = ApiHandler::ErrorResponse(Status::InvalidArgument(
            "request headers exceed " + std::to_string(options_.max_header_bytes) + " bytes"));
        r.status = 431;
        co_await WriteResponse(stream, r, 11, false, false, log);
        Finish(log, remote);
        break;
      }
      if (ec) break;  // closed, timed out, or not HTTP
      registration.SetBusy(true);
      bool keep_going = co_await HandleRequest(stream, buffer, parser, remote);
      registration.SetBusy(false);
      if (!keep_going) break;
    }
    beast::error_code ignored;
    beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  // Handles one request whose header has been read. Returns false if the connection must close.
  template <class Stream>
  net::awaitable<bool> HandleRequest(Stream& stream, beast::flat_buffer& buffer,
                                     http::request_parser<http::buffer_body>& parser,
                                     const std::string& remote) {
    auto& req = parser.get();
    RequestLog log;
    const auto client_id = req["X-Request-Id"];
    log.id = SaneRequestId(std::string_view(client_id.data(), client_id.size()))
                 ? std::string(client_id)
                 : NewRequestId();
    log.method = std::string(req.method_string());
    log.target = std::string(req.target());
    const bool keep_alive = req.keep_alive() && !stopping_;
    const unsigned version = req.version();
    Route route = ApiHandler::Classify(log.target);
    log.route = RouteName(route.kind);
    if (options_.authorizer) {
      const auto header = req[http::field::authorization];
      auto principal = options_.authorizer->Authorize(
          std::string_view(header.data(), header.size()), log.method, route);
      if (!principal.ok()) {
        // Nothing of the request is acted on; a body is drained (bounded) or cut off.
        ApiResponse denied = ApiHandler::ErrorResponse(principal.status());
        for (auto& [name, value] : denied.headers) {
          if (name == "WWW-Authenticate") value = Authorizer::Challenge(route);
        }
        co_await WriteResponse(stream, denied, version, false, false, log);
        const bool expect_continue = beast::iequals(req[http::field::expect], "100-continue");
        if (!parser.is_done() && !expect_continue) {
          std::vector<uint8_t> scratch(64 << 10);
          co_await DrainBeforeClose(stream, buffer, parser, scratch);
        }
        Finish(log, remote);
        co_return false;
      }
      log.principal = principal->name;
      route.model_prefix = principal->model_prefix;
    }
    // With a cluster, a model's writes go through the daemon holding its lease: redirect there
    // before reading any body (a client that sent Expect: 100-continue has sent none yet).
    if (auto redirect = handler_.WriteRedirect(log.method, route, log.target)) {
      const bool body_pending = !parser.is_done();
      co_await WriteResponse(stream, *redirect, version, keep_alive && !body_pending, false, log);
      const bool expect_continue = beast::iequals(req[http::field::expect], "100-continue");
      if (body_pending && !expect_continue) {
        std::vector<uint8_t> scratch(64 << 10);
        co_await DrainBeforeClose(stream, buffer, parser, scratch);
      }
      Finish(log, remote);
      co_return keep_alive && !body_pending;
    }
    bool ok = false;
    switch (ApiHandler::Plan(log.method, route)) {
      case RequestPlan::kPush:
        ok = co_await HandlePush(stream, buffer, parser, route, log, keep_alive);
        break;
      case RequestPlan::kRestore:
        ok = co_await HandleRestore(stream, parser, route, log, keep_alive);
        break;
      case RequestPlan::kSimple: {
        std::string body;
        Status read = co_await ReadSmallBody(stream, buffer, parser, body, log);
        if (!read.ok()) {
          co_await WriteResponse(stream, ApiHandler::ErrorResponse(read), version, false, false,
                                 log);
          break;
        }
        // A model busy with a push or a retention pass refuses changes (ABORTED, nothing
        // done): wait for its turn as pushes do, without holding a thread.
        ApiResponse r = co_await HandleSimple(log.method, route, body);
        const auto wait_until = Clock::now() + options_.push_wait;
        for (int tries_when_free = 0; r.model_busy;) {
          if (!TryAgain(co_await turns_.Await(handler_, route, wait_until), tries_when_free)) break;
          r = co_await HandleSimple(log.method, route, body);
        }
        ok = co_await WriteResponse(stream, r, version, keep_alive, log.method == "HEAD", log);
        ok = ok && keep_alive;
        break;
      }
    }
    Finish(log, remote);
    co_return ok;
  }

  // Whether a request refused as busy tries again after waiting for its model's turn. A model
  // found free yet refusing is tried once more, not again: what refuses then is no writer a
  // wait would outlast.
  static bool TryAgain(ModelTurns::Outcome outcome, int& tries_when_free) {
    switch (outcome) {
      case ModelTurns::Outcome::kTurn:
        return true;
      case ModelTurns::Outcome::kWasFree:
        return ++tries_when_free <= 1;
      case ModelTurns::Outcome::kTimedOut:
      case ModelTurns::Outcome::kStopped:
        return false;
    }
    return false;
  }

  // Handler::Handle for a request with a small body. Administrative passes over whole models
  // (garbage collection, scrub, backup, retention:apply) can take minutes: they run on the
  // admin thread, one at a time, so that they never hold a network thread.
  net::awaitable<ApiResponse> HandleSimple(std::string method, Route route, std::string body) {
    if (!IsAdminPass(route)) co_return handler_.Handle(method, route, body);
    auto executor = co_await net::this_coro::executor;
    PooledCall call =
        PostToPool(admin_pool_, executor,
                   [this, method = std::move(method), route = std::move(route),
                    body = std::move(body)] { return handler_.Handle(method, route, body); });
    co_return co_await AwaitPooled(std::move(call));
  }

  // Logs a finished request and records it in the metrics.
  void Finish(const RequestLog& log, const std::string& remote) {
    LogRequest(log, remote, options_.json_logs);
    handler_.metrics().ObserveRequest(
        log.route, log.method, log.status, log.bytes_in, log.bytes_out,
        std::chrono::duration<double>(Clock::now() - log.start).count());
  }

  template <class Stream>
  net::awaitable<Status> ReadSmallBody(Stream& stream, beast::flat_buffer& buffer,
                                       http::request_parser<http::buffer_body>& parser,
                                       std::string& body, RequestLog& log) {
    char chunk[8192];
    if (!parser.is_done() && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> cont{http::status::continue_, parser.get().version()};
      beast::error_code ec;
      beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
      co_await http::async_write(stream, cont, net::redirect_error(kUseAwaitable, ec));
      if (ec) co_return Status::Unavailable("writing 100 Continue: " + ec.message());
    }
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof chunk;
      beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
      beast::error_code ec;
      co_await http::async_read(stream, buffer, parser, net::redirect_error(kUseAwaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return Status::InvalidArgument("reading request body: " + ec.message());
      body.append(chunk, sizeof chunk - parser.get().body().size);
      log.bytes_in = body.size();
      if (body.size() > options_.max_json_body_bytes) {
        co_return Status::ResourceExhausted(
            "request body exceeds " + std::to_string(options_.max_json_body_bytes) + " bytes");
      }
    }
    co_return Status::Ok();
  }

  template <class Stream>
  net::awaitable<bool> HandlePush(Stream& stream, beast::flat_buffer& buffer,
                                  http::request_parser<http::buffer_body>& parser,
                                  const Route& route, RequestLog& log, bool keep_alive) {
    auto& req = parser.get();
    const unsigned version = req.version();
    std::optional<uint64_t> content_length;
    if (auto cl = parser.content_length()) content_length = *cl;
    const bool expect_continue = beast::iequals(req[http::field::expect], "100-continue");
    std::vector<uint8_t> chunk(options_.io_buffer_bytes);
    // Refusals known from the headers alone are sent before the body is read; the connection
    // then closes because the unread body cannot be skipped cheaply.
    if (content_length && *content_length > options_.max_body_bytes) {
      co_await WriteResponse(
          stream,
          ApiHandler::ErrorResponse(Status::ResourceExhausted(
              "body of " + std::to_string(*content_length) + " bytes exceeds the limit of " +
              std::to_string(options_.max_body_bytes))),
          version, false, false, log);
      if (!expect_continue) co_await DrainBeforeClose(stream, buffer, parser, chunk);
      co_return false;
    }
    // Pushes to one model are serialized: wait for the model's turn (the body stays in the
    // socket meanwhile, so TCP flow control holds the client back).
    auto session = handler_.BeginPush(route, content_length);
    const auto wait_until = Clock::now() + options_.push_wait;
    for (int tries_when_free = 0;
         !session.ok() && session.status().code() == StatusCode::kAborted;) {
      if (!TryAgain(co_await turns_.Await(handler_, route, wait_until), tries_when_free)) break;
      session = handler_.BeginPush(route, content_length);
    }
    if (!session.ok()) {
      co_await WriteResponse(stream, ApiHandler::ErrorResponse(session.status()), version, false,
                             false, log);
      if (!expect_continue) co_await DrainBeforeClose(stream, buffer, parser, chunk);
      co_return false;
    }
    if (expect_continue) {
      http::response<http::empty_body> cont{http::status::continue_, version};
      beast::error_code ec;
      beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
      co_await http::async_write(stream, cont, net::redirect_error(kUseAwaitable, ec));
      if (ec) co_return false;
    }
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
      beast::error_code ec;
      co_await http::async_read(stream, buffer, parser, net::redirect_error(kUseAwaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        // The client went away or sent a broken body; the session aborts on destruction.
        log.status = 499;
        spdlog::warn("push {} aborted after {} bytes: {}", log.target, log.bytes_in, ec.message());
        co_return false;
      }
      const size_t n = chunk.size() - parser.get().body().size;
      log.bytes_in += n;
      if (log.bytes_in > options_.max_body_bytes) {  // chunked bodies announce no length
        session->reset();
        co_await WriteResponse(
            stream,
            ApiHandler::ErrorResponse(Status::ResourceExhausted(
                "body exceeds the limit of " + std::to_string(options_.max_body_bytes) + " bytes")),
            version, false, false, log);
        co_await DrainBeforeClose(stream, buffer, parser, chunk);
        co_return false;
      }
      Status s = (*session)->Write(std::span<const uint8_t>(chunk.data(), n));
      if (!s.ok()) {
        session->reset();  // abort now: frees the model for the next push while we drain
        co_await WriteResponse(stream, ApiHandler::ErrorResponse(s), version, false, false, log);
        co_await DrainBeforeClose(stream, buffer, parser, chunk);
        co_return false;
      }
    }
    // The commit syncs, and the last shard of a sharded version assembles and encodes the whole
    // version: off the network thread. The session ends there, releasing the model's lock
    // before the answer is sent.
    auto executor = co_await net::this_coro::executor;
    PooledCall call =
        PostToPool(commit_pool_, executor, [this, body = std::move(*session)]() mutable {
          ApiResponse answer = handler_.FinishPush(*body);
          body.reset();
          return answer;
        });
    ApiResponse r = co_await AwaitPooled(std::move(call));
    bool ok = co_await WriteResponse(stream, r, version, keep_alive, false, log);
    co_return ok&& keep_alive;
  }

  // After refusing a body mid-way, keeps reading (and discarding) a bounded amount of it so the
  // client, still sending, receives the error response instead of a connection reset.
  template <class Stream>
  net::awaitable<void> DrainBeforeClose(Stream& stream, beast::flat_buffer& buffer,
                                        http::request_parser<http::buffer_body>& parser,
                                        std::vector<uint8_t>& scratch) {
    constexpr uint64_t kMaxDrainBytes = 64ull << 20;
    constexpr auto kMaxDrainTime = std::chrono::seconds(2);
    uint64_t drained = 0;
    beast::error_code ec;
    beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_send, ec);
    while (!parser.is_done() && drained < kMaxDrainBytes) {
      parser.get().body().data = scratch.data();
      parser.get().body().size = scratch.size();
      beast::get_lowest_layer(stream).expires_after(kMaxDrainTime);
      co_await http::async_read(stream, buffer, parser, net::redirect_error(kUseAwaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) break;
      drained += scratch.size() - parser.get().body().size;
    }
  }

  template <class Stream>
  net::awaitable<bool> HandleRestore(Stream& stream,
                                     http::request_parser<http::buffer_body>& parser,
                                     const Route& route, RequestLog& log, bool keep_alive) {
    const unsigned version = parser.get().version();
    const bool head = log.method == "HEAD";
    // A GET with a body is unusual; rather than draining it we close after answering.
    const bool body_pending = !parser.is_done();
    keep_alive = keep_alive && !body_pending;
    const auto& req = parser.get();
    const auto header = [&](http::field field) {
      const auto value = req[field];
      return std::string_view(value.data(), value.size());
    };
    auto restore =
        handler_.BeginRestore(route, header(http::field::range), header(http::field::if_range));
    if (!restore.ok() || restore->refusal) {
      const ApiResponse r =
          restore.ok() ? *restore->refusal : ApiHandler::ErrorResponse(restore.status());
      bool ok = co_await WriteResponse(stream, r, version, keep_alive, head, log);
      co_return ok&& keep_alive;
    }
    RestoreStream& body = *restore->stream;
    http::response<http::buffer_body> res{static_cast<http::status>(restore->status), version};
    res.set(http::field::server, std::string("ckptd/") + kVersionString);
    res.set("X-Request-Id", log.id);
    res.set(http::field::content_type, "application/octet-stream");
    for (const auto& [k, v] : restore->headers) res.set(k, v);
    res.keep_alive(keep_alive);
    res.content_length(body.size());
    log.status = restore->status;
    beast::error_code ec;
    if (head) {
      res.body().data = nullptr;
      res.body().more = false;
      http::response_serializer<http::buffer_body> sr{res};
      beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
      co_await http::async_write_header(stream, sr, net::redirect_error(kUseAwaitable, ec));
      co_return !ec && keep_alive;
    }
    res.body().data = nullptr;
    res.body().more = true;
    http::response_serializer<http::buffer_body> sr{res};
    beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
    co_await http::async_write_header(stream, sr, net::redirect_error(kUseAwaitable, ec));
    if (ec) co_return false;
    // Pieces smaller than kGatherBytes (the header, small tensors) are copied together and sent
    // as one write: a checkpoint of 65,536 scalar tensors otherwise cost a write (and a
    // coroutine resumption) per 4 bytes.
    std::vector<uint8_t> gathered;
    for (;;) {
      auto piece = body.Next();
      if (!piece.ok()) {
        // Headers are gone; the only honest signal left is to cut the connection short of
        // Content-Length so the client sees an incomplete body.
        spdlog::error("restore {} {} failed after {} bytes: {}", log.id, log.target, log.bytes_out,
                      piece.status().ToLogString());
        log.status = 500;
        co_return false;
      }
      const bool last = piece->empty();
      const bool small = !last && piece->size() < kGatherBytes;
      if (small && gathered.size() + piece->size() <= kGatherBytes) {
        gathered.insert(gathered.end(), piece->begin(), piece->end());
        continue;
      }
      if (!gathered.empty()) {
        if (!co_await WriteBodyPiece(stream, sr, res, gathered, true, log)) co_return false;
        gathered.clear();
        if (small) {
          gathered.insert(gathered.end(), piece->begin(), piece->end());
          continue;
        }
      }
      if (!co_await WriteBodyPiece(stream, sr, res, *piece, !last, log)) co_return false;
      if (last) break;
    }
    co_return keep_alive;
  }

  static constexpr size_t kGatherBytes = 64 << 10;

  // Sends `data` as the next piece of a streamed body (`more`: not the last). False, with the
  // log's status 499, if the client is gone.
  template <class Stream>
  net::awaitable<bool> WriteBodyPiece(Stream& stream,
                                      http::response_serializer<http::buffer_body>& sr,
                                      http::response<http::buffer_body>& res,
                                      std::span<const uint8_t> data, bool more, RequestLog& log) {
    res.body().data = data.empty() ? nullptr : const_cast<uint8_t*>(data.data());
    res.body().size = data.size();
    res.body().more = more;
    beast::error_code ec;
    beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
    co_await http::async_write(stream, sr, net::redirect_error(kUseAwaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      log.status = 499;
      co_return false;
    }
    log.bytes_out += data.size();
    co_return true;
  }

  template <class Stream>
  net::awaitable<bool> WriteResponse(Stream& stream, const ApiResponse& r, unsigned version,
                                     bool keep_alive, bool head, RequestLog& log) {
    http::response<http::string_body> res{static_cast<http::status>(r.status), version};
    res.set(http::field::server, std::string("ckptd/") + kVersionString);
    if (!log.id.empty()) res.set("X-Request-Id", log.id);
    if (!r.content_type.empty()) res.set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res.set(k, v);
    res.keep_alive(keep_alive);
    if (head) {
      res.content_length(r.body.size());
    } else {
      res.body() = r.body;
      res.prepare_payload();
    }
    log.status = r.status;
    log.error_detail = r.error_detail;
    log.bytes_out += head ? 0 : r.body.size();
    beast::error_code ec;
    beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
    if (head) {
      http::response_serializer<http::string_body> sr{res};
      co_await http::async_write_header(stream, sr, net::redirect_error(kUseAwaitable, ec));
    } else {
      co_await http::async_write(stream, res, net::redirect_error(kUseAwaitable, ec));
    }
    co_return !ec;
  }

  const HttpServerOptions options_;
  ApiHandler handler_;
  std::unique_ptr<net::ssl::context> tls_;  // null: plain HTTP
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  net::thread_pool admin_pool_{1};  // administrative passes (HandleSimple), one at a time
  // Push commits (HandlePush): two, so that a sharded version's long commit leaves room for
  // another model's.
  net::thread_pool commit_pool_{2};
  std::atomic<bool> stopping_{false};
  ModelTurns turns_;  // after ioc_: stopped before the strands it posts to go
  uint16_t port_ = 0;
  std::atomic<uint64_t> next_session_id_{0};
  std::mutex sessions_mu_;
  std::condition_variable sessions_cv_;
  std::unordered_map<uint64_t, SessionEntry> sessions_;  // guarded by sessions_mu_
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                      CheckpointStore* store) {
  auto server = std::make_unique<HttpServerImpl>(options, store);
  CKPT_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace ckpt::api
