// One connection's request loop (session.h).
#include "server/session.h"

#include <limits>
#include <string_view>

#include "ckpt/codec/encoded_body.h"
#include "ckpt/codec/encoded_pull.h"
#include "pooled_call.h"
#include "server/connections.h"
#include "server/push_transfer.h"
#include "server/restore_transfer.h"
#include "server/wire.h"

namespace ckpt::api::server {
namespace {

// Whether `value` (a Content-Type, or one entry of an Accept list) names `type`, whatever its
// parameters and case.
bool MediaTypeIs(std::string_view value, std::string_view type) {
  value = value.substr(0, value.find(';'));
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  return beast::iequals(beast::string_view(value.data(), value.size()),
                        beast::string_view(type.data(), type.size()));
}

// Whether an Accept header lists `type` with a quality above zero.
bool AcceptsMediaType(std::string_view accept, std::string_view type) {
  while (!accept.empty()) {
    const size_t comma = accept.find(',');
    const std::string_view entry = accept.substr(0, comma);
    const size_t q = entry.find("q=0");
    const bool refused = q != std::string_view::npos &&
                         entry.substr(q + 3).find_first_of("123456789") == std::string_view::npos;
    if (MediaTypeIs(entry, type) && !refused) return true;
    if (comma == std::string_view::npos) break;
    accept.remove_prefix(comma + 1);
  }
  return false;
}

// Capacity of each connection's read buffer, and so the largest single socket read.
constexpr size_t kReadBufferBytes = 256 << 10;

// Handler::Handle for a request with a small body. Administrative passes over whole models run
// on the admin thread, one at a time, so that they never hold a network thread.
net::awaitable<ApiResponse> HandleSimple(const ServerContext& ctx, std::string method, Route route,
                                         std::string body) {
  if (!IsAdminPass(route)) co_return ctx.handler.Handle(method, route, body);
  auto executor = co_await net::this_coro::executor;
  PooledCall call =
      PostToPool(ctx.admin_pool, executor,
                 [&handler = ctx.handler, method = std::move(method), route = std::move(route),
                  body = std::move(body)] { return handler.Handle(method, route, body); });
  co_return co_await AwaitPooled(std::move(call));
}

// A small body read, handled, and answered; a model busy with a push or a retention pass
// refuses changes (ABORTED, nothing done): the request waits for its turn as pushes do,
// without holding a thread.
template <class Stream>
net::awaitable<bool> AnswerSimple(const ServerContext& ctx, Stream& stream, Exchange& ex) {
  std::string body;
  Status read = co_await ReadSmallBody(ctx, stream, ex, body);
  if (!read.ok()) {
    co_await WriteResponse(ctx, stream, ex, ApiHandler::ErrorResponse(read), false);
    co_return false;
  }
  ApiResponse r = co_await HandleSimple(ctx, ex.log.method, ex.route, body);
  const auto wait_until = Clock::now() + ctx.options.push_wait;
  for (int free_in_a_row = 0; r.model_busy;) {
    const ModelTurns::Outcome outcome = co_await ctx.turns.Await(ctx.handler, ex.route, wait_until);
    if (!ModelTurns::TryAgain(outcome, free_in_a_row)) break;
    r = co_await HandleSimple(ctx, ex.log.method, ex.route, body);
  }
  const bool ok =
      co_await WriteResponse(ctx, stream, ex, r, ex.keep_alive, ex.log.method == "HEAD");
  co_return ok&& ex.keep_alive;
}

// Logs a finished request and records it in the metrics.
void Finish(const ServerContext& ctx, const RequestLog& log, const std::string& remote) {
  LogRequest(log, remote, ctx.options.json_logs);
  ctx.handler.metrics().ObserveRequest(
      log.route, log.method, log.status, log.bytes_in, log.bytes_out,
      std::chrono::duration<double>(Clock::now() - log.start).count());
}

// One request whose header has been read. Returns whether the connection stays open.
template <class Stream>
net::awaitable<bool> HandleRequest(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                   const std::string& remote) {
  auto& req = ex.parser.get();
  const auto client_id = req["X-Request-Id"];
  ex.log.id = SaneRequestId(std::string_view(client_id.data(), client_id.size()))
                  ? std::string(client_id)
                  : NewRequestId();
  ex.log.method = std::string(req.method_string());
  ex.log.target = std::string(req.target());
  ex.keep_alive = req.keep_alive() && !ctx.stopping;
  ex.http_version = req.version();
  ex.expect_continue = beast::iequals(req[http::field::expect], "100-continue");
  ex.route = ClassifyTarget(ex.log.target);
  // Media types are compared without their parameters ("; charset=...", "; q=...").
  const auto content_type = req[http::field::content_type];
  const auto accept = req[http::field::accept];
  ex.route.encoded_pull =
      AcceptsMediaType(std::string_view(accept.data(), accept.size()), kEncodedPullMediaType);
  ex.route.encoded_body = MediaTypeIs(std::string_view(content_type.data(), content_type.size()),
                                      kEncodedBodyMediaType);
  ex.route.encoded_shard = MediaTypeIs(std::string_view(content_type.data(), content_type.size()),
                                       kEncodedShardMediaType);
  ex.log.route = RouteName(ex.route.kind);
  if (ctx.options.authorizer) {
    const auto header = req[http::field::authorization];
    auto principal = ctx.options.authorizer->Authorize(
        std::string_view(header.data(), header.size()), ex.log.method, ex.route);
    if (!principal.ok()) {
      // Nothing of the request is acted on.
      ApiResponse denied = ApiHandler::ErrorResponse(principal.status());
      for (auto& [name, value] : denied.headers) {
        if (name == "WWW-Authenticate") value = Authorizer::Challenge(ex.route);
      }
      co_await RefuseAndClose(ctx, stream, ex, denied);
      Finish(ctx, ex.log, remote);
      co_return false;
    }
    ex.log.principal = principal->name;
    ex.route.model_prefix = principal->model_prefix;
  }
  // With a cluster, a model's writes go through the daemon holding its lease: redirect there
  // before reading any body (a client that sent Expect: 100-continue has sent none yet).
  if (auto redirect = ctx.handler.WriteRedirect(ex.log.method, ex.route, ex.log.target)) {
    const bool keep = co_await RefuseAndClose(ctx, stream, ex, *redirect, ex.keep_alive);
    Finish(ctx, ex.log, remote);
    co_return keep;
  }
  bool keep = false;
  switch (PlanOf(ex.log.method, ex.route)) {
    case RequestPlan::kPush:
      keep = co_await TransferPush(ctx, stream, ex);
      break;
    case RequestPlan::kRestore:
      keep = co_await TransferRestore(ctx, stream, ex);
      break;
    case RequestPlan::kSimple:
      keep = co_await AnswerSimple(ctx, stream, ex);
      break;
  }
  Finish(ctx, ex.log, remote);
  co_return keep;
}

}  // namespace

template <class Stream>
net::awaitable<void> Serve(const ServerContext& ctx, Stream& stream, const std::string& remote) {
  Connections::Registration registration(ctx.connections, &beast::get_lowest_layer(stream));
  beast::flat_buffer buffer;
  // Beast sizes each socket read by the buffer's spare capacity; without a reserve a body
  // arrives in reads of a packet or so, each a coroutine resumption.
  buffer.reserve(kReadBufferBytes);
  for (;;) {
    if (ctx.stopping) break;
    RequestParser parser;
    parser.header_limit(ctx.options.max_header_bytes);
    // Body sizes are enforced per route (TransferPush, ReadSmallBody) so that an oversized
    // request still gets its 413 answer instead of a dropped connection.
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    beast::get_lowest_layer(stream).expires_after(ctx.options.idle_timeout);
    beast::error_code ec;
    co_await http::async_read_header(stream, buffer, parser,
                                     net::redirect_error(kUseAwaitable, ec));
    Exchange ex{parser, buffer};
    if (ec == http::error::header_limit) {
      ex.log.method = ex.log.target = "?";
      ApiResponse r = ApiHandler::ErrorResponse(Status::InvalidArgument(
          "request headers exceed " + std::to_string(ctx.options.max_header_bytes) + " bytes"));
      r.status = 431;
      co_await WriteResponse(ctx, stream, ex, r, false);
      Finish(ctx, ex.log, remote);
      break;
    }
    if (ec) break;  // closed, timed out, or not HTTP
    registration.SetBusy(true);
    const bool keep_going = co_await HandleRequest(ctx, stream, ex, remote);
    registration.SetBusy(false);
    if (!keep_going) break;
  }
  beast::error_code ignored;
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_send, ignored);
}

template net::awaitable<void> Serve(const ServerContext&, PlainStream&, const std::string&);
template net::awaitable<void> Serve(const ServerContext&, TlsStream&, const std::string&);

}  // namespace ckpt::api::server
