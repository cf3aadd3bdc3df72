// Waiting for a busy model's turn (model_turns.h).
#include "model_turns.h"

#include <functional>
#include <utility>

namespace ckpt::api {

namespace net = boost::asio;
using Timer = net::steady_timer;

// Shared with the release callbacks, which may outlive a wait (a model released after its
// waiter timed out) and the server: they post to a session's strand only while `stopped` is
// false, under `mu`, so never after Stop.
struct ModelTurns::State {
  std::mutex mu;
  bool stopped = false;                                        // guarded by mu
  uint64_t next_id = 0;                                        // guarded by mu
  std::unordered_map<uint64_t, std::weak_ptr<Timer>> waiting;  // guarded by mu

  // Wakes a waiting session by cancelling its timer, on the timer's own strand. REQUIRES: mu.
  static void WakeLocked(const std::weak_ptr<Timer>& weak) {
    if (auto timer = weak.lock()) net::post(timer->get_executor(), [timer] { timer->cancel(); });
  }
};

namespace {

// The release callback of one wait. A plain function: GCC 12 mishandles closures created inside
// a coroutine (pooled_call.h).
std::function<void()> WakeUp(const std::shared_ptr<ModelTurns::State>& state,
                             const std::shared_ptr<Timer>& timer) {
  return [weak_state = std::weak_ptr(state), weak_timer = std::weak_ptr(timer)] {
    auto shared = weak_state.lock();
    if (!shared) return;
    std::lock_guard lock(shared->mu);
    if (!shared->stopped) ModelTurns::State::WakeLocked(weak_timer);
  };
}

}  // namespace

ModelTurns::ModelTurns() : state_(std::make_shared<State>()) {}

ModelTurns::~ModelTurns() { Stop(); }

net::awaitable<ModelTurns::Outcome> ModelTurns::Await(ApiHandler& handler, const Route& route,
                                                      std::chrono::steady_clock::time_point until) {
  if (std::chrono::steady_clock::now() >= until) co_return Outcome::kTimedOut;
  auto timer = std::make_shared<Timer>(co_await net::this_coro::executor, until);
  uint64_t id = 0;
  {
    std::lock_guard lock(state_->mu);
    if (state_->stopped) co_return Outcome::kStopped;
    id = state_->next_id++;
    state_->waiting.emplace(id, timer);
  }
  // The wake-up is posted to the strand this coroutine runs on, so it cannot slip in before
  // the wait below begins.
  const bool registered = handler.CallWhenModelFree(route, WakeUp(state_, timer));
  Outcome outcome = Outcome::kWasFree;
  if (registered) {
    handler.metrics().RequestWaiting(+1);
    boost::system::error_code ec;
    co_await timer->async_wait(net::redirect_error(net::use_awaitable, ec));
    handler.metrics().RequestWaiting(-1);
    outcome = ec == net::error::operation_aborted ? Outcome::kTurn : Outcome::kTimedOut;
  }
  std::lock_guard lock(state_->mu);
  state_->waiting.erase(id);
  co_return state_->stopped ? Outcome::kStopped : outcome;
}

bool ModelTurns::TryAgain(Outcome outcome, int& free_in_a_row) {
  switch (outcome) {
    case Outcome::kTurn:
      free_in_a_row = 0;
      return true;
    case Outcome::kWasFree:
      return ++free_in_a_row <= 1;
    case Outcome::kTimedOut:
    case Outcome::kStopped:
      return false;
  }
  return false;
}

void ModelTurns::Stop() {
  std::lock_guard lock(state_->mu);
  if (state_->stopped) return;
  state_->stopped = true;
  for (const auto& [id, weak] : state_->waiting) State::WakeLocked(weak);
}

}  // namespace ckpt::api
