// DaemonFixture: a GoogleTest fixture that runs the real ckptd (CKPTD_BINARY) in a temporary
// directory, optionally with a config file, and prints the daemon's log when a test fails.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "test_support.h"

namespace ckpt::testing {

class DaemonFixture : public ::testing::Test {
 protected:
  // Starts the daemon with `config_toml` (when not empty) as its --config file, logging at
  // `log_level` ("info" logs every request). Call through ASSERT_NO_FATAL_FAILURE.
  void StartDaemon(const std::string& config_toml = "", const std::string& log_level = "warn") {
    std::vector<std::string> args;
    if (!config_toml.empty()) {
      const auto config = dir_.path() / "ckptd.toml";
      std::ofstream(config) << config_toml;
      args = {"--config", config.string()};
    }
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(), std::move(args));
    daemon_->set_log_level(log_level);
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }

  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace ckpt::testing
