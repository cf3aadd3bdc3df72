// Answers and small bodies on a session's stream (wire.h).
#include "server/wire.h"

#include <algorithm>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/version.h"

namespace ckpt::api::server {
namespace {

// After refusing a body, keeps reading (and discarding) a bounded amount of it so that the
// client, still sending, receives the answer instead of a connection reset.
template <class Stream>
net::awaitable<void> DrainBeforeClose(Stream& stream, Exchange& ex) {
  constexpr uint64_t kMaxDrainBytes = 64ull << 20;
  constexpr auto kMaxDrainTime = std::chrono::seconds(2);
  std::vector<uint8_t> scratch(64 << 10);
  uint64_t drained = 0;
  beast::error_code ec;
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_send, ec);
  while (!ex.parser.is_done() && drained < kMaxDrainBytes) {
    ex.parser.get().body().data = scratch.data();
    ex.parser.get().body().size = scratch.size();
    beast::get_lowest_layer(stream).expires_after(kMaxDrainTime);
    co_await http::async_read(stream, ex.buffer, ex.parser, net::redirect_error(kUseAwaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    if (ec) break;
    drained += scratch.size() - ex.parser.get().body().size;
  }
}

}  // namespace

template <class Stream>
net::awaitable<bool> WriteResponse(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                   const ApiResponse& r, bool keep_alive, bool head) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), ex.http_version};
  res.set(http::field::server, std::string("ckptd/") + kVersionString);
  if (!ex.log.id.empty()) res.set("X-Request-Id", ex.log.id);
  if (!r.content_type.empty()) res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  if (head) {
    res.content_length(r.body.size());
  } else {
    res.body() = r.body;
    res.prepare_payload();
  }
  ex.log.status = r.status;
  ex.log.error_detail = r.error_detail;
  ex.log.bytes_out += head ? 0 : r.body.size();
  beast::error_code ec;
  beast::get_lowest_layer(stream).expires_after(ctx.options.io_timeout);
  if (head) {
    http::response_serializer<http::string_body> sr{res};
    co_await http::async_write_header(stream, sr, net::redirect_error(kUseAwaitable, ec));
  } else {
    co_await http::async_write(stream, res, net::redirect_error(kUseAwaitable, ec));
  }
  co_return !ec;
}

template <class Stream>
net::awaitable<bool> RefuseAndClose(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                    const ApiResponse& r, bool keep_alive) {
  const bool keep = keep_alive && ex.parser.is_done();
  const bool written = co_await WriteResponse(ctx, stream, ex, r, keep);
  if (ex.BodyComing()) co_await DrainBeforeClose(stream, ex);
  co_return written&& keep;
}

template <class Stream>
net::awaitable<Status> SendContinue(const ServerContext& ctx, Stream& stream, Exchange& ex) {
  if (!ex.expect_continue || ex.continue_sent) co_return Status::Ok();
  http::response<http::empty_body> cont{http::status::continue_, ex.http_version};
  beast::error_code ec;
  beast::get_lowest_layer(stream).expires_after(ctx.options.io_timeout);
  co_await http::async_write(stream, cont, net::redirect_error(kUseAwaitable, ec));
  if (ec) co_return Status::Unavailable("writing 100 Continue: " + ec.message());
  ex.continue_sent = true;
  co_return Status::Ok();
}

template <class Stream>
net::awaitable<Status> ReadSmallBody(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                     std::string& body) {
  char chunk[8192];
  if (!ex.parser.is_done()) {
    Status told = co_await SendContinue(ctx, stream, ex);
    if (!told.ok()) co_return told;
  }
  while (!ex.parser.is_done()) {
    ex.parser.get().body().data = chunk;
    ex.parser.get().body().size = sizeof chunk;
    beast::get_lowest_layer(stream).expires_after(ctx.options.io_timeout);
    beast::error_code ec;
    co_await http::async_read(stream, ex.buffer, ex.parser, net::redirect_error(kUseAwaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    if (ec) co_return Status::InvalidArgument("reading request body: " + ec.message());
    body.append(chunk, sizeof chunk - ex.parser.get().body().size);
    ex.log.bytes_in = body.size();
    // A plan's body is a checkpoint's header, which may be as long as a push's allows.
    const uint64_t limit =
        ex.route.kind == RouteKind::kPlan || ex.route.kind == RouteKind::kShardPlan
            ? std::max<uint64_t>(ctx.options.max_json_body_bytes, kMaxSafetensorsHeaderBytes + 8)
            : ctx.options.max_json_body_bytes;
    if (body.size() > limit) {
      co_return Status::ResourceExhausted("request body exceeds " + std::to_string(limit) +
                                          " bytes");
    }
  }
  co_return Status::Ok();
}

#define CKPT_WIRE_INSTANTIATE(Stream)                                                     \
  template net::awaitable<bool> WriteResponse(const ServerContext&, Stream&, Exchange&,   \
                                              const ApiResponse&, bool, bool);            \
  template net::awaitable<bool> RefuseAndClose(const ServerContext&, Stream&, Exchange&,  \
                                               const ApiResponse&, bool);                 \
  template net::awaitable<Status> SendContinue(const ServerContext&, Stream&, Exchange&); \
  template net::awaitable<Status> ReadSmallBody(const ServerContext&, Stream&, Exchange&, \
                                                std::string&);
CKPT_WIRE_INSTANTIATE(PlainStream)
CKPT_WIRE_INSTANTIATE(TlsStream)
#undef CKPT_WIRE_INSTANTIATE

}  // namespace ckpt::api::server
