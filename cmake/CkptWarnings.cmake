# Warnings and sanitizers for every ckptd target, set in one place.
add_library(ckpt_build_flags INTERFACE)
target_compile_options(ckpt_build_flags INTERFACE
  -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wpedantic)
if(CKPT_WERROR)
  target_compile_options(ckpt_build_flags INTERFACE -Werror)
endif()
if(CKPT_SANITIZE)
  target_compile_options(ckpt_build_flags INTERFACE -fsanitize=${CKPT_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(ckpt_build_flags INTERFACE -fsanitize=${CKPT_SANITIZE})
endif()
target_include_directories(ckpt_build_flags INTERFACE ${CMAKE_BINARY_DIR}/generated)
