// The Hugging Face view of a version (GET .../versions/{v}/hf/{file}): the version's tensors cut
// into files of at most a given size, in body order (a new file whenever the next tensor would
// not fit; a tensor larger than the size gets a file of its own), listed by
// model.safetensors.index.json as transformers' sharded checkpoints are. Internal to api/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::api {

inline constexpr std::string_view kHfIndexName = "model.safetensors.index.json";
// transformers' default max_shard_size ("5GB").
inline constexpr uint64_t kDefaultHfFileBytes = 5'000'000'000;

struct HfFiles {
  std::vector<std::string> files;                           // model-00001-of-0000N.safetensors
  std::map<std::string, std::vector<std::string>> tensors;  // file -> its tensors, body order
  std::map<std::string, std::string> weight_map;            // tensor -> its file
  uint64_t total_size = 0;                                  // bytes of every tensor
};

HfFiles PlanHfFiles(const VersionDetail& detail, uint64_t max_file_bytes);

// The index document: {"metadata": {"total_size": N, "version": V}, "weight_map": {tensor:
// file}} (`version`: the version the files are of, for "latest").
std::string HfIndexJson(const HfFiles& files, uint64_t version);

}  // namespace ckpt::api
