// A push's body into the store (push_transfer.h).
#include "server/push_transfer.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <span>
#include <vector>

#include "pooled_call.h"
#include "server/wire.h"

namespace ckpt::api::server {

template <class Stream>
net::awaitable<bool> TransferPush(const ServerContext& ctx, Stream& stream, Exchange& ex) {
  const HttpServerOptions& options = ctx.options;
  std::optional<uint64_t> content_length;
  if (auto cl = ex.parser.content_length()) content_length = *cl;
  // Refusals known from the headers alone are sent before the body is read; the connection
  // then closes because the unread body cannot be skipped cheaply.
  if (content_length && *content_length > options.max_body_bytes) {
    co_await RefuseAndClose(
        ctx, stream, ex,
        ApiHandler::ErrorResponse(Status::ResourceExhausted(
            "body of " + std::to_string(*content_length) + " bytes exceeds the limit of " +
            std::to_string(options.max_body_bytes))));
    co_return false;
  }
  // Pushes to one model are serialized: wait for the model's turn (the body stays in the
  // socket meanwhile, so TCP flow control holds the client back).
  auto session = ctx.handler.BeginPush(ex.route, content_length);
  const auto wait_until = Clock::now() + options.push_wait;
  for (int free_in_a_row = 0; !session.ok() && session.status().code() == StatusCode::kAborted;) {
    const ModelTurns::Outcome outcome = co_await ctx.turns.Await(ctx.handler, ex.route, wait_until);
    if (!ModelTurns::TryAgain(outcome, free_in_a_row)) break;
    session = ctx.handler.BeginPush(ex.route, content_length);
  }
  if (!session.ok()) {
    co_await RefuseAndClose(ctx, stream, ex, ApiHandler::ErrorResponse(session.status()));
    co_return false;
  }
  const Status told = co_await SendContinue(ctx, stream, ex);
  if (!told.ok()) co_return false;
  std::vector<uint8_t> chunk(options.io_buffer_bytes);
  while (!ex.parser.is_done()) {
    ex.parser.get().body().data = chunk.data();
    ex.parser.get().body().size = chunk.size();
    beast::get_lowest_layer(stream).expires_after(options.io_timeout);
    beast::error_code ec;
    co_await http::async_read(stream, ex.buffer, ex.parser, net::redirect_error(kUseAwaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      // The client went away or sent a broken body; the session aborts on destruction.
      ex.log.status = 499;
      spdlog::warn("push {} aborted after {} bytes: {}", ex.log.target, ex.log.bytes_in,
                   ec.message());
      co_return false;
    }
    const size_t n = chunk.size() - ex.parser.get().body().size;
    ex.log.bytes_in += n;
    if (ex.log.bytes_in > options.max_body_bytes) {  // chunked bodies announce no length
      session->reset();
      co_await RefuseAndClose(
          ctx, stream, ex,
          ApiHandler::ErrorResponse(Status::ResourceExhausted(
              "body exceeds the limit of " + std::to_string(options.max_body_bytes) + " bytes")));
      co_return false;
    }
    Status s = (*session)->Write(std::span<const uint8_t>(chunk.data(), n));
    if (!s.ok()) {
      session->reset();  // abort now: frees the model for the next push while we drain
      co_await RefuseAndClose(ctx, stream, ex, ApiHandler::ErrorResponse(s));
      co_return false;
    }
  }
  // The commit syncs, and the last shard of a sharded version assembles and encodes the whole
  // version: off the network thread. The session ends there, releasing the model's lock
  // before the answer is sent.
  auto executor = co_await net::this_coro::executor;
  PooledCall call = PostToPool(ctx.commit_pool, executor,
                               [&handler = ctx.handler, body = std::move(*session)]() mutable {
                                 ApiResponse answer = handler.FinishPush(*body);
                                 body.reset();
                                 return answer;
                               });
  ApiResponse r = co_await AwaitPooled(std::move(call));
  const bool ok = co_await WriteResponse(ctx, stream, ex, r, ex.keep_alive);
  co_return ok&& ex.keep_alive;
}

template net::awaitable<bool> TransferPush(const ServerContext&, PlainStream&, Exchange&);
template net::awaitable<bool> TransferPush(const ServerContext&, TlsStream&, Exchange&);

}  // namespace ckpt::api::server
