// Write leases on models (model_leases.h).
#include "backends/rados/model_leases.h"

#include <cstdio>
#include <list>
#include <random>
#include <utility>
#include <vector>

#include "backends/rados/rados_layout.h"
#include "backends/rados/rados_status.h"

namespace ckpt {

using namespace rados_layout;

ModelLeases::ModelLeases(librados::IoCtx* io, std::chrono::milliseconds lease,
                         const std::string& advertise_url)
    : io_(io), lease_(lease) {
  std::random_device random;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", random(), random());
  cookie_ = std::string(id) + " " + advertise_url;
}

ModelState& ModelLeases::StateOf(const std::string& model) {
  std::lock_guard lock(states_mu_);
  auto& slot = states_[model];
  if (!slot) slot = std::make_unique<ModelState>();
  return *slot;
}

int ModelLeases::LockWithFlags(const std::string& model, ModelState& state, uint8_t flags) {
  const auto ms = lease_.count();
  timeval duration{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  const auto requested = RadosClock::now();
  const int r = io_->lock_exclusive(ModelObject(model), kLockName, cookie_, "ckptd write lease",
                                    &duration, flags);
  // How long after requesting a lock this daemon trusts it: most of the lease, leaving room for
  // clock rate differences and the request's own latency.
  if (r == 0) state.lease_valid_until = requested + lease_ * 3 / 4;
  return r;
}

int ModelLeases::Lock(const std::string& model, ModelState& state) {
  return LockWithFlags(model, state, LIBRADOS_LOCK_FLAG_MAY_RENEW);
}

Result<std::optional<std::string>> ModelLeases::Holder(const std::string& model) {
  int exclusive = 0;
  std::string tag;
  std::list<librados::locker_t> lockers;
  const int r = io_->list_lockers(ModelObject(model), kLockName, &exclusive, &tag, &lockers);
  if (r == -ENOENT) return std::optional<std::string>();
  CKPT_RETURN_IF_ERROR(FromRados(r, "reading the write lease of model '" + model + "'"));
  for (const auto& locker : lockers) {
    if (locker.cookie == cookie_) continue;
    const size_t space = locker.cookie.find(' ');
    return std::optional<std::string>(space == std::string::npos ? std::string()
                                                                 : locker.cookie.substr(space + 1));
  }
  return std::optional<std::string>();
}

void ModelLeases::RenewAll() {
  std::vector<std::pair<std::string, ModelState*>> owned;
  {
    std::lock_guard lock(states_mu_);
    for (auto& [model, state] : states_) owned.emplace_back(model, state.get());
  }
  for (auto& [model, state] : owned) {
    std::lock_guard lock(state->mu);
    if (!state->owned) continue;
    if (LockWithFlags(model, *state, LIBRADOS_LOCK_FLAG_MUST_RENEW) != 0) {
      state->owned = false;  // expired and taken, or unreachable: claim again on next write
      leases_lost_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void ModelLeases::ReleaseAll() {
  std::lock_guard lock(states_mu_);
  for (auto& [model, state] : states_) {
    if (state->owned) io_->unlock(ModelObject(model), kLockName, cookie_);
  }
  for (auto& [model, state] : states_) (void)state->writes.WaitAll();
}

size_t ModelLeases::OwnedCount() {
  std::vector<ModelState*> states;
  {
    std::lock_guard lock(states_mu_);
    for (auto& [model, state] : states_) states.push_back(state.get());
  }
  size_t owned = 0;
  for (ModelState* state : states) {
    std::lock_guard lock(state->mu);
    owned += state->owned ? 1 : 0;
  }
  return owned;
}

}  // namespace ckpt
