// RocksDB key layouts (docs/design.md). All integers are big-endian so that byte order equals
// numeric order and a model's versions are one ordered prefix scan. Model names never contain
// '\0', so "<model>\0" is an unambiguous prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::storage_keys {

inline void AppendBigEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline uint64_t ReadBigEndian(std::string_view in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(in[pos + i]);
  return v;
}

// "<model>\0": prefix of every per-model key in the versions, manifests and chunks families.
inline std::string ModelPrefix(std::string_view model) {
  std::string k(model);
  k.push_back('\0');
  return k;
}

// The first key after every key with ModelPrefix(model).
inline std::string ModelPrefixEnd(std::string_view model) {
  std::string k(model);
  k.push_back('\1');
  return k;
}

// "<model>\0" + u64: the key of a version (number = version) or of a manifest (number = seq),
// and the first chunk key of manifest `number`.
inline std::string NumberedKey(std::string_view model, uint64_t number) {
  std::string k = ModelPrefix(model);
  AppendBigEndian(k, number, 8);
  return k;
}

// versions: "<model>\0" + u64 version.
inline std::string VersionKey(std::string_view model, uint64_t version) {
  return NumberedKey(model, version);
}

// manifests: "<model>\0" + u64 seq.
inline std::string ManifestKey(std::string_view model, uint64_t seq) {
  return NumberedKey(model, seq);
}

// chunks: "<model>\0" + u64 seq + u32 tensor index + u32 chunk index.
inline std::string ChunkKey(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  std::string k = NumberedKey(model, seq);
  AppendBigEndian(k, tensor, 4);
  AppendBigEndian(k, chunk, 4);
  return k;
}

// First chunk key of `seq` (inclusive) — with ChunkSeqBegin(model, seq + 1) a range covering
// every chunk written by that push.
inline std::string ChunkSeqBegin(std::string_view model, uint64_t seq) {
  return NumberedKey(model, seq);
}

// tags: "<model>\0" + tag name -> u64 version.
inline std::string TagKey(std::string_view model, std::string_view tag) {
  std::string k = ModelPrefix(model);
  k.append(tag);
  return k;
}

// default family: "awaiting-compaction\0<model>" (AwaitingCompactionRecord). The family holds
// nothing else; the prefix leaves room for other kinds of record there.
inline constexpr std::string_view kAwaitingCompactionPrefix{"awaiting-compaction\0", 20};

inline std::string AwaitingCompactionKey(std::string_view model) {
  std::string k(kAwaitingCompactionPrefix);
  k.append(model);
  return k;
}

// Decodes the u64 that follows "<model>\0" in a versions/manifests/chunks key.
inline uint64_t NumberAfterPrefix(std::string_view key, size_t model_size) {
  return ReadBigEndian(key, model_size + 1, 8);
}

}  // namespace ckpt::storage_keys
