# Warnings and sanitizers for every ckptd target, set in one place.
add_library(ckpt_build_flags INTERFACE)
target_compile_options(ckpt_build_flags INTERFACE
  -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wpedantic)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  # The lossy kernels combine comparisons with '&' on purpose (branch-free selection).
  target_compile_options(ckpt_build_flags INTERFACE -Wno-bitwise-instead-of-logical)
  # Boost 1.74 looks for coroutines in libc++'s <experimental/coroutine> under clang; with
  # libstdc++'s <coroutine> (which clang 14 supports) it must be told.
  target_compile_definitions(ckpt_build_flags INTERFACE BOOST_ASIO_HAS_CO_AWAIT=1)
endif()
if(CKPT_WERROR)
  target_compile_options(ckpt_build_flags INTERFACE -Werror)
endif()
if(CKPT_SANITIZE)
  target_compile_options(ckpt_build_flags INTERFACE -fsanitize=${CKPT_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(ckpt_build_flags INTERFACE -fsanitize=${CKPT_SANITIZE})
  if(CKPT_SANITIZE MATCHES "undefined" AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # clang 14's -fsanitize=function cannot emit coroutines ("Cannot represent a difference
    # across sections" in http_server.cc).
    target_compile_options(ckpt_build_flags INTERFACE -fno-sanitize=function)
  endif()
  if(CKPT_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # Asio uses std::atomic_thread_fence, which GCC warns TSan cannot model; not our code.
    target_compile_options(ckpt_build_flags INTERFACE -Wno-tsan)
  endif()
endif()
if(CKPT_BUILD_FUZZ)
  # Coverage instrumentation for libFuzzer in every library; harnesses link -fsanitize=fuzzer.
  target_compile_options(ckpt_build_flags INTERFACE -fsanitize=fuzzer-no-link)
endif()
target_include_directories(ckpt_build_flags INTERFACE ${CMAKE_BINARY_DIR}/generated)
