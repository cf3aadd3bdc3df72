// ModelTurns: requests refused because their model is busy (ABORTED) wait here for its turn,
// each on a timer that the model's release (CheckpointStore::CallWhenModelFree), its deadline or
// the server's shutdown ends; the session then tries again. No thread is held and nothing polls.
// Internal to api/.
//
// Thread safety: safe for concurrent use. A wait runs on its session's strand; releases and
// Stop come from any thread.
#pragma once

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format on

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "ckpt/api/api_handler.h"

namespace ckpt::api {

class ModelTurns {
 public:
  enum class Outcome {
    kTurn,      // the model's writer finished: try again
    kWasFree,   // the model had no writer any more when the wait began: try again, once
    kTimedOut,  // `until` passed
    kStopped,   // the server is shutting down
  };

  ModelTurns();
  // Stop()s: no release reaches a session after this.
  ~ModelTurns();

  // Waits for the turn of `route`'s model, on the calling coroutine's executor (its strand).
  boost::asio::awaitable<Outcome> Await(ApiHandler& handler, const Route& route,
                                        std::chrono::steady_clock::time_point until);

  // Ends every wait (kStopped) and every later one at once.
  void Stop();

  // Whether a request refused as busy tries again after a wait that ended with `outcome`. A
  // model found free twice in a row, yet refusing, is not tried again: what refuses then is no
  // writer a wait would outlast. `free_in_a_row` counts those, per request.
  static bool TryAgain(Outcome outcome, int& free_in_a_row);

  struct State;  // shared with the release callbacks (model_turns.cc)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ckpt::api
