// DaemonProcess: runs the real ckptd binary on an ephemeral loopback port with a given data
// directory, for integration and end-to-end tests. Readiness is the --ready-file the daemon
// writes after it starts accepting connections.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ckpt::testing {

class DaemonProcess {
 public:
  DaemonProcess(std::string binary, std::filesystem::path work_dir,
                std::vector<std::string> extra_args = {})
      : binary_(std::move(binary)), work_dir_(std::move(work_dir)), extra_(std::move(extra_args)) {}
  ~DaemonProcess() { Kill(); }

  // Starts the daemon and waits until it accepts connections. Returns false (with the log in
  // `error()`) if it exits or does not become ready within 30 s.
  bool Start() {
    const auto ready = work_dir_ / "ready";
    std::filesystem::remove(ready);
    const auto log = work_dir_ / "ckptd.log";
    std::vector<std::string> args = {
        binary_,        "--listen",     listen_,       "--data-dir", (work_dir_ / "data").string(),
        "--ready-file", ready.string(), "--log-level", log_level_};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::filesystem::exists(ready)) {
        std::ifstream in(ready);
        in >> port_;
        if (port_ != 0) return true;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  // SIGTERM and wait; returns the exit status (or -1 if it was killed by a signal).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // SIGKILL and wait: a crash.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // The --listen address. Default: "127.0.0.1:0" (a free port).
  void set_listen(std::string listen) { listen_ = std::move(listen); }
  pid_t pid() const { return pid_; }

  // The --log-level the daemon starts with. Default: warn.
  void set_log_level(std::string level) { log_level_ = std::move(level); }

  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::filesystem::path data_dir() const { return work_dir_ / "data"; }
  std::string log() const {
    std::ifstream in(work_dir_ / "ckptd.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string binary_;
  std::filesystem::path work_dir_;
  std::vector<std::string> extra_;
  std::string log_level_ = "warn";
  std::string listen_ = "127.0.0.1:0";
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Bytes of the files under `dir` (apparent sizes, which are the data the files hold).
inline uint64_t DirectoryBytes(const std::filesystem::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(dir, ec);
  for (; !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (!it->is_regular_file(size_ec)) continue;
    const uint64_t size = it->file_size(size_ec);
    if (!size_ec) total += size;
  }
  return total;
}

}  // namespace ckpt::testing
