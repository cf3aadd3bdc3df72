// Session: what the ckpt CLI's commands share for one run.
#pragma once

#include <optional>

#include "ckpt/client/client.h"
#include "progress_bar.h"

namespace ckpt::cli {

// What the commands share: the client (made from the global options on first use), whether
// output is JSON, and the progress bar. Thread-compatible.
class Session {
 public:
  // `draw_progress`: transfers draw the progress bar (on a terminal).
  Session(ClientOptions options, bool json, bool draw_progress)
      : options_(std::move(options)), json_(json) {
    if (draw_progress) {
      options_.progress = [this](uint64_t done, uint64_t total) { progress_.Update(done, total); };
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The client of the global options; the error if they do not make one.
  Result<Client*> client();
  bool json() const { return json_; }
  ProgressBar& progress() { return progress_; }

 private:
  ClientOptions options_;
  bool json_;
  ProgressBar progress_;
  std::optional<Client> client_;
};

}  // namespace ckpt::cli
