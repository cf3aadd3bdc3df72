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
  if(CKPT_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # Asio uses std::atomic_thread_fence, which GCC warns TSan cannot model; not our code.
    target_compile_options(ckpt_build_flags INTERFACE -Wno-tsan)
  endif()
endif()
target_include_directories(ckpt_build_flags INTERFACE ${CMAKE_BINARY_DIR}/generated)
