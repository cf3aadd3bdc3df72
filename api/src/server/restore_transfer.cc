// A stored body to the socket (restore_transfer.h).
#include "server/restore_transfer.h"

#include <spdlog/spdlog.h>

#include <span>
#include <string_view>
#include <vector>

#include "ckpt/version.h"
#include "server/wire.h"

namespace ckpt::api::server {
namespace {

// Pieces smaller than this (the header, small tensors) are copied together and sent as one
// write: a checkpoint of many scalar tensors otherwise costs a write (and a coroutine
// resumption) per tensor.
constexpr size_t kGatherBytes = 64 << 10;

// Sends `data` as the next piece of a streamed body (`more`: not the last). False, with the
// log's status 499, if the client is gone.
template <class Stream>
net::awaitable<bool> WriteBodyPiece(const ServerContext& ctx, Stream& stream,
                                    http::response_serializer<http::buffer_body>& sr,
                                    http::response<http::buffer_body>& res,
                                    std::span<const uint8_t> data, bool more, RequestLog& log) {
  res.body().data = data.empty() ? nullptr : const_cast<uint8_t*>(data.data());
  res.body().size = data.size();
  res.body().more = more;
  beast::error_code ec;
  beast::get_lowest_layer(stream).expires_after(ctx.options.io_timeout);
  co_await http::async_write(stream, sr, net::redirect_error(kUseAwaitable, ec));
  if (ec == http::error::need_buffer) ec = {};
  if (ec) {
    log.status = 499;
    co_return false;
  }
  log.bytes_out += data.size();
  co_return true;
}

}  // namespace

template <class Stream>
net::awaitable<bool> TransferRestore(const ServerContext& ctx, Stream& stream, Exchange& ex) {
  const bool head = ex.log.method == "HEAD";
  // A GET with a body is unusual; rather than draining it we close after answering.
  const bool keep_alive = ex.keep_alive && ex.parser.is_done();
  const auto& req = ex.parser.get();
  const auto header = [&](http::field field) {
    const auto value = req[field];
    return std::string_view(value.data(), value.size());
  };
  auto restore =
      ctx.handler.BeginRestore(ex.route, header(http::field::range), header(http::field::if_range));
  if (!restore.ok() || restore->refusal) {
    const ApiResponse r =
        restore.ok() ? *restore->refusal : ApiHandler::ErrorResponse(restore.status());
    const bool ok = co_await WriteResponse(ctx, stream, ex, r, keep_alive, head);
    co_return ok&& keep_alive;
  }
  RestoreStream& body = *restore->stream;
  http::response<http::buffer_body> res{static_cast<http::status>(restore->status),
                                        ex.http_version};
  res.set(http::field::server, std::string("ckptd/") + kVersionString);
  res.set("X-Request-Id", ex.log.id);
  res.set(http::field::content_type, "application/octet-stream");
  for (const auto& [k, v] : restore->headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.content_length(body.size());
  ex.log.status = restore->status;
  beast::error_code ec;
  res.body().data = nullptr;
  res.body().more = !head;
  http::response_serializer<http::buffer_body> sr{res};
  beast::get_lowest_layer(stream).expires_after(ctx.options.io_timeout);
  co_await http::async_write_header(stream, sr, net::redirect_error(kUseAwaitable, ec));
  if (head) co_return !ec && keep_alive;
  if (ec) co_return false;
  std::vector<uint8_t> gathered;
  for (;;) {
    auto piece = body.Next();
    if (!piece.ok()) {
      // Headers are gone; the only honest signal left is to cut the connection short of
      // Content-Length so the client sees an incomplete body.
      spdlog::error("restore {} {} failed after {} bytes: {}", ex.log.id, ex.log.target,
                    ex.log.bytes_out, piece.status().ToLogString());
      ex.log.status = 500;
      co_return false;
    }
    const bool last = piece->empty();
    const bool small = !last && piece->size() < kGatherBytes;
    if (small && gathered.size() + piece->size() <= kGatherBytes) {
      gathered.insert(gathered.end(), piece->begin(), piece->end());
      continue;
    }
    if (!gathered.empty()) {
      if (!co_await WriteBodyPiece(ctx, stream, sr, res, gathered, true, ex.log)) co_return false;
      gathered.clear();
      if (small) {
        gathered.insert(gathered.end(), piece->begin(), piece->end());
        continue;
      }
    }
    if (!co_await WriteBodyPiece(ctx, stream, sr, res, *piece, !last, ex.log)) co_return false;
    if (last) break;
  }
  co_return keep_alive;
}

template net::awaitable<bool> TransferRestore(const ServerContext&, PlainStream&, Exchange&);
template net::awaitable<bool> TransferRestore(const ServerContext&, TlsStream&, Exchange&);

}  // namespace ckpt::api::server
