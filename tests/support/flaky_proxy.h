// FlakyProxy: a loopback TCP proxy in front of a daemon that cuts its first connections in the
// middle of a request or response body, so that a client's retries and resumes are tested
// against a real network failure rather than hoped for.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt::testing {

// Owns a listening socket, an accept thread and one thread per proxied connection; the
// destructor stops them all. Thread-safe.
class FlakyProxy {
 public:
  // Which direction's bytes are counted against the cut.
  enum class Cut { kRequest, kResponse };

  // Forwards to 127.0.0.1:`target_port`; the first `cuts` connections are closed (both ways)
  // once more than `cut_after` bytes came from the client (kRequest) or the daemon (kResponse;
  // the first `cut_after` bytes are forwarded).
  FlakyProxy(uint16_t target_port, int cuts, uint64_t cut_after, Cut which = Cut::kRequest)
      : target_port_(target_port), cuts_left_(cuts), cut_after_(cut_after), which_(which) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(listener_, 64);
    socklen_t len = sizeof addr;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FlakyProxy() {
    stopping_ = true;
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    accept_thread_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  uint16_t port() const { return port_; }
  int cut() const { return cut_; }

 private:
  void AcceptLoop() {
    while (!stopping_) {
      const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      const bool cut = cuts_left_.fetch_sub(1) > 0;
      std::lock_guard lock(mu_);
      threads_.emplace_back([this, client, cut] { Pump(client, cut); });
    }
  }

  void Pump(int client, bool cut) {
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(target_port_);
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      uint64_t counted = 0;
      std::vector<char> buffer(64 << 10);
      bool open = true;
      while (open && !stopping_) {
        pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
        if (poll(fds, 2, 100) < 0) break;
        for (int i = 0; i < 2 && open; ++i) {
          if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          const ssize_t n = read(fds[i].fd, buffer.data(), buffer.size());
          if (n <= 0) {
            open = false;
            break;
          }
          ssize_t forward = n;
          if (cut && (i == 0) == (which_ == Cut::kRequest)) {
            if (counted + static_cast<uint64_t>(n) > cut_after_) {
              forward = which_ == Cut::kResponse ? static_cast<ssize_t>(cut_after_ - counted) : 0;
              ++cut_;
              open = false;
            }
            counted += static_cast<uint64_t>(n);
          }
          const int to = i == 0 ? server : client;
          for (ssize_t done = 0; done < forward;) {
            const ssize_t w = write(to, buffer.data() + done, static_cast<size_t>(forward - done));
            if (w <= 0) {
              open = false;
              break;
            }
            done += w;
          }
        }
      }
    }
    close(server);
    close(client);
  }

  const uint16_t target_port_;
  std::atomic<int> cuts_left_;
  const uint64_t cut_after_;
  const Cut which_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> cut_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> threads_;  // guarded by mu_
};

}  // namespace ckpt::testing
