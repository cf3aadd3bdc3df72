// Hashes used by ckptd: XXH3-64 chunk checksums and SHA-256 of whole checkpoint bodies.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace ckpt {

// XXH3 64-bit hash of `bytes` (seed 0). Persisted in chunk records; never change the seed.
uint64_t Xxh3Checksum(std::span<const uint8_t> bytes);

// Incremental SHA-256 (OpenSSL EVP).
//
// Thread-compatible: one object per stream.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::span<const uint8_t> bytes);
  void Update(std::string_view bytes);
  // Returns the digest as 64 lowercase hex characters. The object must not be updated after.
  std::string FinishHex();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
