#include "lossy/kernel_choice.h"

namespace ckpt::lossy {
namespace {

thread_local LossyKernels chosen_kernels = LossyKernels::kFastest;

}  // namespace

ScopedKernelChoice::ScopedKernelChoice(LossyKernels kernels) : previous_(chosen_kernels) {
  chosen_kernels = kernels;
}

ScopedKernelChoice::~ScopedKernelChoice() { chosen_kernels = previous_; }

bool PortableKernelsChosen() { return chosen_kernels == LossyKernels::kPortable; }

}  // namespace ckpt::lossy
