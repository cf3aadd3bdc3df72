// Write leases on models in an S3 bucket (s3_leases.h).
#include "backends/s3/s3_leases.h"

#include <cstdio>
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
  return json{{"format", 1}, {"owner", id_}, {"url", url_}, {"released", released}}.dump();
}

Result<std::optional<S3Leases::Lease>> S3Leases::Read(const std::string& model) {
  auto object = client_->Get(s3_layout::LeaseKey(model));
  if (object.status().code() == StatusCode::kNotFound) return std::optional<Lease>();
  CKPT_RETURN_IF_ERROR(
      object.status().WithContext("reading the write lease of model '" + model + "'"));
  Lease lease;
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
  return std::optional<Lease>(std::move(lease));
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
  CKPT_ASSIGN_OR_RETURN(std::optional<Lease> now, Read(model));
  if (now && now->owner == id_ && now->released == released) return now->etag;
  return written;
}

Result<bool> S3Leases::Lock(const std::string& model, S3ModelState& state) {
  const auto asked = S3Clock::now();
  CKPT_ASSIGN_OR_RETURN(std::optional<Lease> lease, Read(model));
  const bool ours = lease && lease->owner == id_ && !lease->released;
  if (lease && !ours && !lease->released && !lease->expired) {
    state.owned = false;
    return Status::Unavailable("model '" + model + "' is written through another ckptd daemon" +
                               (lease->url.empty() ? "" : " (" + lease->url + ")") +
                               "; send writes there");
  }
  auto written = Write(model, lease ? lease->etag : "", false);
  if (written.status().code() == StatusCode::kFailedPrecondition) {
    state.owned = false;
    return Status::Unavailable("model '" + model +
                               "': another ckptd daemon took its write lease first; retry");
  }
  CKPT_RETURN_IF_ERROR(
      written.status().WithContext("taking the write lease of model '" + model + "'"));
  const bool renewed = ours && state.owned && state.lease_etag == lease->etag;
  state.lease_etag = *written;
  state.lease_valid_until = asked + lease_ - lease_ / 4;
  if (!renewed) state.owned = false;  // the caller fences former writers, then owns the model
  return !renewed;
}

Result<std::optional<std::string>> S3Leases::Holder(const std::string& model) {
  CKPT_ASSIGN_OR_RETURN(std::optional<Lease> lease, Read(model));
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
  for (auto& [model, state] : all) {
    std::lock_guard lock(state->mu);
    if (!state->owned) continue;
    const auto asked = S3Clock::now();
    auto written = Write(model, state->lease_etag, false);
    if (written.ok()) {
      state->lease_etag = *written;
      state->lease_valid_until = asked + lease_ - lease_ / 4;
    } else if (written.status().code() == StatusCode::kFailedPrecondition ||
               S3Clock::now() >= state->lease_valid_until) {
      state->owned = false;  // taken over, or unreachable for too long: claim again on write
      leases_lost_.fetch_add(1, std::memory_order_relaxed);
    }
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
    std::lock_guard lock(state->mu);
    if (state->owned) (void)Write(model, state->lease_etag, true);
    state->owned = false;
  }
}

size_t S3Leases::OwnedCount() {
  std::vector<S3ModelState*> states;
  {
    std::lock_guard lock(states_mu_);
    for (auto& [model, state] : states_) states.push_back(state.get());
  }
  size_t owned = 0;
  for (S3ModelState* state : states) {
    std::lock_guard lock(state->mu);
    owned += state->owned ? 1 : 0;
  }
  return owned;
}

}  // namespace ckpt
