// Write leases on models in an S3 bucket (s3_leases.h).
#include "backends/s3/s3_leases.h"

#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backends/s3/s3_metadata_log.h"

namespace ckpt {

using json = nlohmann::json;

S3Leases::S3Leases(S3Client* client, std::chrono::milliseconds lease,
                   const std::string& advertise_url)
    : client_(client), lease_(lease), url_(advertise_url) {
  std::random_device random;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", random(), random());
  id_ = id;
}

S3ModelState& S3Leases::StateOf(const std::string& model) {
  std::lock_guard lock(states_mu_);
  auto& state = states_[model];
  if (!state) state = std::make_unique<S3ModelState>();
  return *state;
}

std::string S3Leases::Body(bool released) const {
  thread_local std::mt19937_64 random(std::random_device{}());
  return json{{"format", 1},
              {"owner", id_},
              {"url", url_},
              {"released", released},
              {"nonce", std::to_string(random())}}
      .dump();
}

Result<std::optional<S3Leases::Stored>> S3Leases::Read(const std::string& model) {
  auto object = client_->Get(s3_layout::LeaseKey(model));
  if (object.status().code() == StatusCode::kNotFound) return std::optional<Stored>();
  CKPT_RETURN_IF_ERROR(
      object.status().WithContext("reading the write lease of model '" + model + "'"));
  Stored lease;
  lease.etag = object->etag;
  const json doc = json::parse(object->body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.value("owner", json()).is_string()) {
    return Status::DataLoss("s3: the write lease of model '" + model + "' is malformed");
  }
  lease.owner = doc["owner"].get<std::string>();
  lease.url = doc.value("url", "");
  lease.released = doc.value("released", false);
  // Server time on both sides; one second of resolution added for the truncated Last-Modified.
  const int64_t age = object->server_date - object->last_modified;
  const int64_t lease_seconds = (lease_.count() + 999) / 1000;
  lease.expired = object->server_date > 0 && object->last_modified > 0 && age > lease_seconds + 1;
  return std::optional<Stored>(std::move(lease));
}

Result<std::string> S3Leases::Write(const std::string& model, const std::string& etag,
                                    bool released) {
  S3Condition condition;
  if (etag.empty()) {
    condition.if_none_match = true;
  } else {
    condition.if_match = etag;
  }
  auto written = client_->Put(s3_layout::LeaseKey(model), Body(released), condition);
  if (written.status().code() != StatusCode::kFailedPrecondition) return written;
  // A 412 may answer the retry of our own write whose answer was lost: the lease is ours if it
  // names us.
  CKPT_ASSIGN_OR_RETURN(std::optional<Stored> now, Read(model));
  if (now && now->owner == id_ && now->released == released) return now->etag;
  return written;
}

Result<bool> S3Leases::Lock(const std::string& model, S3ModelState& state) {
  const auto asked = S3Clock::now();
  CKPT_ASSIGN_OR_RETURN(std::optional<Stored> lease, Read(model));
  const bool ours = lease && lease->owner == id_ && !lease->released;
  if (lease && !ours && !lease->released && !lease->expired) {
    state.SetOwned(false);
    return Status::Unavailable("model '" + model + "' is written through another ckptd daemon" +
                               (lease->url.empty() ? "" : " (" + lease->url + ")") +
                               "; send writes there");
  }
  auto written = Write(model, lease ? lease->etag : "", false);
  if (written.status().code() == StatusCode::kFailedPrecondition) {
    state.SetOwned(false);
    return Status::Unavailable("model '" + model +
                               "': another ckptd daemon took its write lease first; retry");
  }
  CKPT_RETURN_IF_ERROR(
      written.status().WithContext("taking the write lease of model '" + model + "'"));
  std::lock_guard lock(state.lease_mu);
  const bool renewed = ours && state.lease.owned && state.lease.etag == lease->etag;
  state.lease.etag = *written;
  state.lease.valid_until = asked + lease_ - lease_ / 4;
  if (!renewed) state.lease.owned = false;  // the caller fences former writers, then owns it
  return !renewed;
}

Result<std::optional<std::string>> S3Leases::Holder(const std::string& model) {
  CKPT_ASSIGN_OR_RETURN(std::optional<Stored> lease, Read(model));
  if (!lease || lease->released || lease->expired || lease->owner == id_) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(lease->url);
}

void S3Leases::RenewAll() {
  std::vector<std::pair<std::string, S3ModelState*>> all;
  {
    std::lock_guard lock(states_mu_);
    for (auto& [model, state] : states_) all.emplace_back(model, state.get());
  }
  // On threads of their own (not the client's, which chunk writes may keep busy), 16 at once.
  constexpr size_t kInFlight = 16;
  for (size_t begin = 0; begin < all.size(); begin += kInFlight) {
    std::vector<std::future<void>> renewals;
    for (size_t i = begin; i < std::min(all.size(), begin + kInFlight); ++i) {
      renewals.push_back(
          std::async(std::launch::async, [this, &all, i] { Renew(all[i].first, *all[i].second); }));
    }
    for (auto& renewal : renewals) renewal.wait();
  }
}

void S3Leases::Renew(const std::string& model, S3ModelState& state) {
  const S3Lease held = state.Lease();
  if (!held.owned) return;
  const auto asked = S3Clock::now();
  auto written = Write(model, held.etag, false);
  std::lock_guard lock(state.lease_mu);
  // A claim changed the lease meanwhile: its view stands.
  if (!state.lease.owned || state.lease.etag != held.etag) return;
  if (written.ok()) {
    state.lease.etag = *written;
    state.lease.valid_until = asked + lease_ - lease_ / 4;
  } else if (written.status().code() == StatusCode::kFailedPrecondition ||
             S3Clock::now() >= state.lease.valid_until) {
    state.lease.owned = false;  // taken over, or unreachable too long: claim again on write
    leases_lost_.fetch_add(1, std::memory_order_relaxed);
  }
}

void S3Leases::ReleaseAll() {
  std::vector<std::pair<std::string, S3ModelState*>> all;
  {
    std::lock_guard lock(states_mu_);
    for (auto& [model, state] : states_) all.emplace_back(model, state.get());
  }
  for (auto& [model, state] : all) {
    (void)state->writes.WaitAll();
    std::lock_guard lock(state->lease_mu);
    if (state->lease.owned) (void)Write(model, state->lease.etag, true);
    state->lease.owned = false;
  }
}

size_t S3Leases::OwnedCount() {
  std::vector<S3ModelState*> states;
  {
    std::lock_guard lock(states_mu_);
    for (auto& [model, state] : states_) states.push_back(state.get());
  }
  size_t owned = 0;
  for (S3ModelState* state : states) owned += state->Lease().owned ? 1 : 0;
  return owned;
}

}  // namespace ckpt
