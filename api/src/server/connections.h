// Connections: the open connections of a server, for the connection limit and for shutdown
// (idle ones are closed at once, busy ones are awaited). Internal to api/.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "server/server_context.h"

namespace ckpt::api::server {

class Connections {
 public:
  // Registers a connection for its lifetime.
  class Registration {
   public:
    Registration(Connections& connections, PlainStream* stream);
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    // Whether a request is in progress (a busy connection is not closed as idle).
    void SetBusy(bool busy);

   private:
    Connections& connections_;
    uint64_t id_;
  };

  // Whether `max_connections` (0: no limit) are open.
  bool AtLimit(size_t max_connections);
  // Closes every idle connection, each on its own strand.
  void CloseIdle();
  // Waits up to `grace` for every connection to end; returns how many are still open.
  size_t AwaitClosed(std::chrono::seconds grace);

 private:
  struct Entry {
    PlainStream* stream;
    bool busy;
  };

  std::mutex mu_;
  std::condition_variable closed_;
  uint64_t next_id_ = 0;                      // guarded by mu_
  std::unordered_map<uint64_t, Entry> open_;  // guarded by mu_
};

}  // namespace ckpt::api::server
