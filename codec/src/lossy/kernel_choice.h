// Which machine code the lossy codec runs on the calling thread: the vector kernels the CPU has
// (AVX2 and FMA where present) or their portable twins. Both write and read the same bytes; the
// choice exists so that tests can run each on one machine (LossyCodecOptions::kernels).
#pragma once

#include "ckpt/codec/lossy_codec.h"

namespace ckpt::lossy {

// Sets the calling thread's choice for the lifetime of the object (one codec call), then
// restores the previous one. Thread-confined: the codec runs each call on the caller's thread,
// so a choice never reaches another thread's call.
class ScopedKernelChoice {
 public:
  explicit ScopedKernelChoice(LossyKernels kernels);
  ~ScopedKernelChoice();
  ScopedKernelChoice(const ScopedKernelChoice&) = delete;
  ScopedKernelChoice& operator=(const ScopedKernelChoice&) = delete;

 private:
  const LossyKernels previous_;
};

// True while a ScopedKernelChoice of kPortable is alive on this thread.
bool PortableKernelsChosen();

}  // namespace ckpt::lossy
