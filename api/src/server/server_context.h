// What the parts of the HTTP server share: the Beast and Asio names, the two stream types a
// session serves (plain TCP and TLS), the server-wide state a session works with
// (ServerContext) and the state of one request and its answer (Exchange). Internal to api/.
//
// Thread safety: ServerContext's members are each safe for concurrent use; an Exchange belongs
// to its session's strand.
#pragma once

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format on

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <string>

#include "ckpt/api/api_handler.h"
#include "ckpt/api/http_server.h"
#include "model_turns.h"
#include "request_log.h"

namespace ckpt::api::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
inline constexpr auto kUseAwaitable = net::use_awaitable;

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using RequestParser = http::request_parser<http::buffer_body>;

class Connections;

// Owned by the server; outlives every session.
struct ServerContext {
  const HttpServerOptions& options;
  ApiHandler& handler;
  net::thread_pool& admin_pool;   // administrative passes, one at a time
  net::thread_pool& commit_pool;  // push commits, off the network threads
  ModelTurns& turns;              // requests waiting for a busy model
  Connections& connections;       // the open connections
  const std::atomic<bool>& stopping;
};

// One request whose header has been read, and what its answer has done so far.
struct Exchange {
  Exchange(RequestParser& request, beast::flat_buffer& read_buffer)
      : parser(request), buffer(read_buffer) {}

  RequestParser& parser;
  beast::flat_buffer& buffer;
  RequestLog log;
  Route route;
  unsigned http_version = 11;
  bool keep_alive = false;
  // The client sent Expect: 100-continue and holds its body back until told to send it.
  bool expect_continue = false;
  bool continue_sent = false;

  // Whether the client is sending (or will send, having been told to) a body not read yet.
  bool BodyComing() const { return !parser.is_done() && (!expect_continue || continue_sent); }
};

}  // namespace ckpt::api::server
