// ServerMetrics: what GET /metrics reports, in the Prometheus text format (prometheus-cpp).
//
// Request metrics are recorded as requests finish (by route, method and status; latency by
// route; bytes in and out), and the requests waiting for a busy model's turn. Store and model
// figures are read when /metrics is scraped: each model's raw and stored bytes, ratio and version
// count, the store's counters (pushes, codec time, deletions by retention, bytes freed by garbage
// collection) and RocksDB's sizes and pending compaction bytes. docs/api.md lists every family.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ckpt/storage/checkpoint_store.h"

namespace prometheus {
class Registry;
}

namespace ckpt::api {

class ServerMetrics {
 public:
  ServerMetrics();
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Records one finished request. `route` is a RouteName().
  void ObserveRequest(std::string_view route, std::string_view method, int status,
                      uint64_t bytes_in, uint64_t bytes_out, double seconds);

  // A request starts (+1) or stops (-1) waiting for a busy model's turn.
  void RequestWaiting(int delta) { requests_waiting_.fetch_add(delta, std::memory_order_relaxed); }

  // The exposition text: the request metrics, then the store's figures read now.
  std::string Render(CheckpointStore& store) const;

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  std::atomic<int64_t> requests_waiting_{0};
};

}  // namespace ckpt::api
