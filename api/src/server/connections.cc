// The open connections of a server (connections.h).
#include "server/connections.h"

namespace ckpt::api::server {

Connections::Registration::Registration(Connections& connections, PlainStream* stream)
    : connections_(connections) {
  std::lock_guard lock(connections_.mu_);
  id_ = connections_.next_id_++;
  connections_.open_.emplace(id_, Entry{stream, false});
}

Connections::Registration::~Registration() {
  std::lock_guard lock(connections_.mu_);
  connections_.open_.erase(id_);
  connections_.closed_.notify_all();
}

void Connections::Registration::SetBusy(bool busy) {
  std::lock_guard lock(connections_.mu_);
  connections_.open_.at(id_).busy = busy;
}

bool Connections::AtLimit(size_t max_connections) {
  if (max_connections == 0) return false;
  std::lock_guard lock(mu_);
  return open_.size() >= max_connections;
}

void Connections::CloseIdle() {
  std::lock_guard lock(mu_);
  for (auto& [id, entry] : open_) {
    if (entry.busy) continue;
    // Runs on the connection's strand. The session may have ended (and freed its stream)
    // before this runs; it deregisters on that same strand, so finding it registered means it
    // lives.
    net::post(entry.stream->get_executor(), [this, connection = id] {
      std::lock_guard inner(mu_);
      auto it = open_.find(connection);
      if (it == open_.end() || it->second.busy) return;
      beast::error_code ignored;
      it->second.stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
      it->second.stream->socket().close(ignored);
    });
  }
}

size_t Connections::AwaitClosed(std::chrono::seconds grace) {
  std::unique_lock lock(mu_);
  closed_.wait_for(lock, grace, [this] { return open_.empty(); });
  return open_.size();
}

}  // namespace ckpt::api::server
