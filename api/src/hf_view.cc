// The Hugging Face view (hf_view.h).
#include "hf_view.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace ckpt::api {

HfFiles PlanHfFiles(const VersionDetail& detail, uint64_t max_file_bytes) {
  std::vector<std::vector<const TensorDetail*>> groups;
  uint64_t filled = 0;
  for (const TensorDetail& t : detail.tensors) {
    if (t.dropped) continue;  // retention dropped it: the version restores without it
    if (groups.empty() || (filled > 0 && filled + t.raw_bytes > max_file_bytes)) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(&t);
    filled += t.raw_bytes;
  }
  HfFiles out;
  for (size_t i = 0; i < groups.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, groups.size());
    out.files.emplace_back(name);
    for (const TensorDetail* t : groups[i]) {
      out.tensors[name].push_back(t->name);
      out.weight_map[t->name] = name;
      out.total_size += t->raw_bytes;
    }
  }
  return out;
}

std::string HfIndexJson(const HfFiles& files, uint64_t version) {
  const nlohmann::json doc = {
      {"metadata", {{"total_size", files.total_size}, {"version", version}}},
      {"weight_map", files.weight_map}};
  return doc.dump(2) + "\n";
}

}  // namespace ckpt::api
