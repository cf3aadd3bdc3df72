// Fuzzes the encoded push (PushBodyFormat::kEncoded) against a real store: a model holds version
// 1, pushed encoded; each input is pushed as version 2 of it. Invariants: no crash or sanitizer
// report; a refused body is refused as the client's fault (400/409 codes), never as corrupt
// data or a bug; a body taken restores, with the size and digest its version announces.
//
// Input: byte 0 chooses the form. Bit 0 clear: the rest is what follows the preamble (chunk
// frames and the end frame), and the harness writes the preamble of the current plan, so the
// frames meet the plan's checks; set: the rest is the whole body. Bit 1 set: the body is an
// encoded shard (format 2, raw frames too), shard 0 of 2 of version 2; once it is stored, the
// harness sends shard 1 plain, whose arrival commits the version. The model is removed and
// seeded again after each input, so every input meets the same state.
#include <cstdlib>
#include <filesystem>

#include "ckpt/base/hashing.h"
#include "encoded_push_scenario.h"

using namespace ckpt;

namespace {

struct Harness {
  std::filesystem::path dir;
  std::unique_ptr<CheckpointStore> store;
  std::string preamble;        // of version 2's plan
  std::string shard_preamble;  // of the plan of version 2's shard 0
  std::string shard_1;         // version 2's shard 1, plain
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
  const std::string v2 = fuzz::ScenarioCheckpoint(2);
  const std::string shard_0 = fuzz::ScenarioShardOf(fuzz::AsSpan(v2), 0);
  const std::string shard_body = fuzz::EncodeShardForStore(*harness->store, "m", 2, 0, shard_0,
                                                           fuzz::ScenarioShardOf(reference, 0));
  harness->shard_preamble =
      shard_body.substr(0, 32 + CheckpointView::Parse(fuzz::AsSpan(shard_0))->raw_header().size());
  harness->shard_1 = fuzz::ScenarioShardOf(fuzz::AsSpan(v2), 1);
  return 0;
}

namespace {

// Checks that version 2, which the store took, restores to what it announced.
void CheckRestores(CheckpointStore& store, const std::string& sha256) {
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
  fuzz::Check(bytes == (*restore)->size() && sha.FinishHex() == sha256,
              "a version taken restores to what it announced");
}

const std::initializer_list<StatusCode> kRefusals = {
    StatusCode::kInvalidArgument, StatusCode::kFailedPrecondition, StatusCode::kResourceExhausted};

// Sends `body` as encoded shard 0 of version 2, then shard 1 plain.
void PushShards(CheckpointStore& store, const std::string& body) {
  PushOptions options;
  options.body_format = PushBodyFormat::kEncoded;
  auto shard = store.BeginShard("m", 2, 0, 2, body.size(), options);
  fuzz::CheckStatusIn(shard.status(), {}, "BeginShard");
  const Status written = (*shard)->Write(fuzz::AsSpan(body));
  fuzz::CheckStatusIn(written, kRefusals, "Write of the encoded shard");
  if (!written.ok()) return;
  auto stored = (*shard)->Finish();
  fuzz::CheckStatusIn(stored.status(), kRefusals, "Finish of the encoded shard");
  if (!stored.ok()) return;
  auto last = store.BeginShard("m", 2, 1, 2, harness->shard_1.size(), PushOptions());
  fuzz::CheckStatusIn(last.status(), {}, "BeginShard of shard 1");
  fuzz::CheckStatusIn((*last)->Write(fuzz::AsSpan(harness->shard_1)), {}, "Write of shard 1");
  auto committed = (*last)->Finish();
  fuzz::CheckStatusIn(committed.status(), kRefusals, "the commit");
  if (committed.ok() && committed->version) CheckRestores(store, committed->version->sha256);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const uint8_t form = in.Byte();
  const bool whole = form & 1;
  const bool shard = form & 2;
  const auto rest = in.Rest();
  std::string body = whole ? std::string() : shard ? harness->shard_preamble : harness->preamble;
  body.append(reinterpret_cast<const char*>(rest.data()), rest.size());

  CheckpointStore& store = *harness->store;
  if (shard) {
    PushShards(store, body);
    fuzz::CheckStatusIn(store.DeleteModel("m"), {}, "DeleteModel");
    fuzz::SeedScenarioModel(store, "m");
    return 0;
  }
  PushOptions options;
  options.body_format = PushBodyFormat::kEncoded;
  auto push = store.BeginPush("m", 2, body.size(), options);
  fuzz::CheckStatusIn(push.status(), {}, "BeginPush");
  const Status written = (*push)->Write(fuzz::AsSpan(body));
  fuzz::CheckStatusIn(written, kRefusals, "Write");
  if (written.ok()) {
    auto committed = (*push)->Commit();
    fuzz::CheckStatusIn(committed.status(), kRefusals, "Commit");
    if (committed.ok()) CheckRestores(store, committed->sha256);
  }
  push->reset();
  // The same state for the next input.
  if (store.GetModel("m")->latest_version != 1) {
    fuzz::CheckStatusIn(store.DeleteModel("m"), {}, "DeleteModel");
    fuzz::SeedScenarioModel(store, "m");
  }
  return 0;
}
