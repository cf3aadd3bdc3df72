// Work that must not hold a network thread (a push's commit, an administrative pass), run on a
// thread pool while the HTTP session that asked for it waits on a timer. Internal to api/.
#pragma once

#include <boost/asio.hpp>
#include <memory>
#include <optional>

#include "ckpt/api/api_handler.h"

namespace ckpt::api {

// Work posted to a pool (PostToPool) that a session awaits (AwaitPooled): a timer that wakes the
// session, and the answer.
struct PooledCall {
  std::shared_ptr<boost::asio::steady_timer> wake;
  std::shared_ptr<std::optional<ApiResponse>> result;
};

// Runs `work` (returning an ApiResponse) on `pool`. `work` owns what it uses, since the session
// may end (a shutdown) before it finishes: the pool must be joined after the network threads.
// A plain function, called in a statement of its own: GCC 12 destroys a closure passed to a
// coroutine, or alive across a co_await, twice.
template <typename Executor, typename Work>
PooledCall PostToPool(boost::asio::thread_pool& pool, const Executor& executor, Work work) {
  PooledCall call{std::make_shared<boost::asio::steady_timer>(
                      executor, boost::asio::steady_timer::time_point::max()),
                  std::make_shared<std::optional<ApiResponse>>()};
  // The work posts its result back to the session's executor and wakes it by cancelling a
  // timer that never expires (with Boost 1.74, co_spawn across execution contexts corrupts the
  // coroutine frame allocator, so no coroutine runs on a pool thread).
  boost::asio::post(pool, [call, work = std::move(work)]() mutable {
    ApiResponse r = work();
    boost::asio::post(call.wake->get_executor(), [call, r = std::move(r)]() mutable {
      *call.result = std::move(r);
      call.wake->cancel();
    });
  });
  return call;
}

// The answer of `call`, once its work is done; 503 if the server stops first.
inline boost::asio::awaitable<ApiResponse> AwaitPooled(PooledCall call) {
  // Sessions run on strands: the result is stored (and the timer cancelled) on the session's
  // strand, after this coroutine started waiting.
  boost::system::error_code ec;
  if (!*call.result) {
    co_await call.wake->async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  }
  if (!*call.result) co_return ApiHandler::ErrorResponse(Status::Unavailable("shutting down"));
  co_return std::move(**call.result);
}

}  // namespace ckpt::api
