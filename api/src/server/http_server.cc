// HttpServer: the listener, in the shape of Beast's advanced server example. It accepts
// connections (refusing those over max_connections), runs each as a session coroutine on its
// own strand (session.h; TLS after a handshake), and on shutdown stops accepting, closes idle
// connections, ends requests waiting for a busy model, and waits for busy ones up to
// shutdown_grace. Every safety limit is a named option in HttpServerOptions.
#include "ckpt/api/http_server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "server/connections.h"
#include "server/server_context.h"
#include "server/session.h"
#include "tls_context.h"

namespace ckpt::api {
namespace {

using namespace server;  // NOLINT(build/namespaces): the server's own parts

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(const HttpServerOptions& options, CheckpointStore* store)
      : options_(options),
        handler_(store, options.on_versions_changed, options.decode_encoded_payloads),
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
    connections_.CloseIdle();
    turns_.Stop();  // a request waiting for a busy model answers now
    if (const size_t busy = connections_.AwaitClosed(options_.shutdown_grace); busy > 0) {
      spdlog::warn("shutdown: {} connection(s) still busy after {}s, cutting them", busy,
                   options_.shutdown_grace.count());
    }
    ioc_.stop();
    Join();
    admin_pool_.join();   // an administrative pass in progress finishes first
    commit_pool_.join();  // and so does a commit
  }

 private:
  void Join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
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
      // algorithm meets the client's delayed ACK and stalls each response until the ACK timer.
      socket.set_option(tcp::no_delay(true), ec);
      if (connections_.AtLimit(options_.max_connections)) {
        RefuseConnection(std::move(socket));
        continue;
      }
      auto executor = socket.get_executor();
      if (tls_) {
        net::co_spawn(executor, TlsSession(std::move(socket)), LogEscapedException);
      } else {
        net::co_spawn(executor, PlainSession(std::move(socket)), LogEscapedException);
      }
    }
  }

  static std::string RemoteOf(const tcp::socket& socket) {
    beast::error_code ec;
    auto endpoint = socket.remote_endpoint(ec);
    return ec ? std::string("?")
              : endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
  }

  net::awaitable<void> PlainSession(tcp::socket socket) {
    const std::string remote = RemoteOf(socket);
    PlainStream stream(std::move(socket));
    co_await Serve(context_, stream, remote);
  }

  // HTTPS: the TLS handshake (bounded by io_timeout), then the same session as plain HTTP.
  net::awaitable<void> TlsSession(tcp::socket socket) {
    const std::string remote = RemoteOf(socket);
    TlsStream stream(std::move(socket), *tls_);
    beast::get_lowest_layer(stream).expires_after(options_.io_timeout);
    beast::error_code ec;
    co_await stream.async_handshake(net::ssl::stream_base::server,
                                    net::redirect_error(kUseAwaitable, ec));
    if (ec) {
      spdlog::info("{} TLS handshake failed: {}", remote, ec.message());
      co_return;
    }
    co_await Serve(context_, stream, remote);
  }

  const HttpServerOptions options_;
  ApiHandler handler_;
  std::unique_ptr<net::ssl::context> tls_;  // null: plain HTTP
  std::atomic<bool> stopping_{false};
  ModelTurns turns_;
  // Before ioc_: sessions still suspended at destruction deregister from it as ~io_context
  // destroys them.
  Connections connections_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  net::thread_pool admin_pool_{1};  // administrative passes, one at a time
  // Push commits: two, so that a sharded version's long commit leaves room for another
  // model's.
  net::thread_pool commit_pool_{2};
  const ServerContext context_{options_, handler_,     admin_pool_, commit_pool_,
                               turns_,   connections_, stopping_};
  uint16_t port_ = 0;
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                      CheckpointStore* store) {
  auto server = std::make_unique<HttpServerImpl>(options, store);
  CKPT_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace ckpt::api
