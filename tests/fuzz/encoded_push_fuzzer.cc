// Fuzzes the encoded push (PushBodyFormat::kEncoded) against a real store: a model holds version
// 1, pushed encoded; each input is pushed as version 2 of it. Invariants: no crash or sanitizer
// report; a refused body is refused as the client's fault (400/409 codes), never as corrupt
// data or a bug; a body taken restores, with the size and digest its version announces.
//
// Input: byte 0 chooses the form. Even: the rest is what follows the preamble (chunk frames and
// the end frame), and the harness writes the preamble of the current plan, so the frames meet the
// plan's checks. Odd: the rest is the whole body. The model is removed and seeded again after
// each input, so every input meets the same state.
#include <cstdlib>
#include <filesystem>

#include "ckpt/base/hashing.h"
#include "encoded_push_scenario.h"

using namespace ckpt;

namespace {

struct Harness {
  std::filesystem::path dir;
  std::unique_ptr<CheckpointStore> store;
  std::string preamble;  // of version 2's plan
};

Harness* harness = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness = new Harness;
  std::string dir = (std::filesystem::temp_directory_path() / "ckpt-fuzz-enc-XXXXXX").string();
  fuzz::Check(mkdtemp(dir.data()) != nullptr, "mkdtemp");
  harness->dir = dir;
  std::atexit([] { std::filesystem::remove_all(harness->dir); });
  harness->store = fuzz::OpenScenarioStore(dir);
  const std::vector<uint8_t> reference = fuzz::SeedScenarioModel(*harness->store, "m");
  const std::string body = fuzz::EncodeForStore(*harness->store, "m", 2,
                                                fuzz::ScenarioCheckpoint(2), reference, nullptr);
  // The preamble ends where the first frame (tag 1) begins: after the header it carries.
  const uint64_t header_bytes =
      CheckpointView::Parse(fuzz::AsSpan(fuzz::ScenarioCheckpoint(2)))->raw_header().size();
  harness->preamble = body.substr(0, 32 + header_bytes);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const bool whole = in.Byte() & 1;
  const auto rest = in.Rest();
  std::string body = whole ? std::string() : harness->preamble;
  body.append(reinterpret_cast<const char*>(rest.data()), rest.size());

  CheckpointStore& store = *harness->store;
  PushOptions options;
  options.body_format = PushBodyFormat::kEncoded;
  const std::initializer_list<StatusCode> refusals = {StatusCode::kInvalidArgument,
                                                      StatusCode::kFailedPrecondition,
                                                      StatusCode::kResourceExhausted};
  auto push = store.BeginPush("m", 2, body.size(), options);
  fuzz::CheckStatusIn(push.status(), {}, "BeginPush");
  const Status written = (*push)->Write(fuzz::AsSpan(body));
  fuzz::CheckStatusIn(written, refusals, "Write");
  if (written.ok()) {
    auto committed = (*push)->Commit();
    fuzz::CheckStatusIn(committed.status(), refusals, "Commit");
    if (committed.ok()) {
      auto restore = store.OpenRestore("m", 2);
      fuzz::CheckStatusIn(restore.status(), {}, "OpenRestore");
      Sha256 sha;
      uint64_t bytes = 0;
      for (;;) {
        auto piece = (*restore)->Next();
        fuzz::CheckStatusIn(piece.status(), {}, "restoring a version the store took");
        if (piece->empty()) break;
        sha.Update(*piece);
        bytes += piece->size();
      }
      fuzz::Check(bytes == (*restore)->size() && sha.FinishHex() == committed->sha256,
                  "a version taken restores to what it announced");
    }
  }
  push->reset();
  // The same state for the next input.
  if (store.GetModel("m")->latest_version != 1) {
    fuzz::CheckStatusIn(store.DeleteModel("m"), {}, "DeleteModel");
    fuzz::SeedScenarioModel(store, "m");
  }
  return 0;
}
