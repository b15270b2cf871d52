# Sanitizer builds: ZERO_SANITIZE = "" (default: none) | address | thread.
#
#   address  AddressSanitizer + UndefinedBehaviorSanitizer on every C/C++ target:
#              -fsanitize=address,undefined -fno-sanitize-recover=undefined
#              -fno-omit-frame-pointer (and, with GCC, -fsanitize=float-cast-overflow, which
#              clang's "undefined" already contains and GCC's does not)
#            so any UB report ends the test with a non-zero status, as a memory error does.
#   thread   ThreadSanitizer (-fsanitize=thread -fno-omit-frame-pointer). The gtest cases of
#            ZERO_SANITIZE_TSAN_TESTS (the in-process communicator and engine tests) get the
#            extra CTest label `tsan` and run with ZERO_CPU_THREADS=1: libgomp is not built
#            with TSan, so TSan cannot see the barrier that ends an OpenMP parallel region and
#            would report races on kernel buffers that are not races. With one thread a kernel
#            launch never opens a parallel region (kernels/cpu/isa/segment_loop.h runs on the
#            calling thread when the team is 1); the OpenMP loops themselves are covered by
#            the ASan/UBSan build and the kernel tests. What TSan checks is ours: the local
#            communicator's threads-as-ranks, the engine's progress/completion paths, the guard.
#
# `make sanitize` builds both (build-asan, build-tsan) and runs the tests; see the Makefile.
# The build type is the caller's (the Makefile uses RelWithDebInfo: optimised, with line
# numbers in the reports). CUDA is not instrumented: configure sanitizer builds with
# -DZERO_CUDA=OFF (the Makefile does).
#
# Run-time options are compiled into every executable (cmake/ZeroSanitizeDefaults.cc:
# __asan_default_options, __lsan_default_suppressions, ...), so `ctest --test-dir build-asan`
# and running a test binary by hand behave like `make sanitize`; ASAN_OPTIONS, LSAN_OPTIONS,
# UBSAN_OPTIONS and TSAN_OPTIONS in the environment still add to or override them.
#
# This file is included from cmake/ZeroOptions.cmake (after ZERO_HAVE_CUDA/MPI are known).
# The compile and link flags apply to every target defined after it, i.e. all of them.

set(ZERO_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan+UBSan), thread (TSan) or empty (none)")
set_property(CACHE ZERO_SANITIZE PROPERTY STRINGS "" address thread)
set(ZERO_SANITIZE_TSAN_TESTS
  zero_local_comm_test zero_engine_test zero_guard_test zero_checkpoint_test
  CACHE STRING "ZERO_SANITIZE=thread: the gtest binaries whose cases get the CTest label tsan")

if(NOT ZERO_SANITIZE MATCHES "^(|address|thread)$")
  message(FATAL_ERROR "ZERO_SANITIZE=${ZERO_SANITIZE}: expected address, thread or empty")
endif()

set(ZERO_SANITIZE_FLAGS)
if(ZERO_SANITIZE STREQUAL "address")
  set(ZERO_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
                          -fno-omit-frame-pointer)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND ZERO_SANITIZE_FLAGS -fsanitize=float-cast-overflow)
  endif()
elseif(ZERO_SANITIZE STREQUAL "thread")
  set(ZERO_SANITIZE_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
endif()

if(ZERO_SANITIZE_FLAGS)
  if(ZERO_HAVE_CUDA)
    message(WARNING "ZERO_SANITIZE=${ZERO_SANITIZE} with CUDA: the CUDA code is not instrumented "
                    "and the CUDA runtime may not start under the sanitizer; use -DZERO_CUDA=OFF")
  endif()
  # C and C++ only (nvcc would not take these flags); the C example is a test too.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${ZERO_SANITIZE_FLAGS}>")
  add_link_options(${ZERO_SANITIZE_FLAGS})
  message(STATUS "ZeroRT: sanitizer ${ZERO_SANITIZE} (${ZERO_SANITIZE_FLAGS})")

  # Programs that are not built here but load libzerort.so (python3 through ctypes, the example
  # built against the installed package by tests/install/check_install.sh) need the ASan runtime
  # preloaded: its path goes to <build>/zero_asan_runtime.txt for the Makefile's
  # `LD_PRELOAD=$(cat ...)` run of those two tests.
  if(ZERO_SANITIZE STREQUAL "address")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-runtime-dir
                      OUTPUT_VARIABLE rt_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
      set(ZERO_ASAN_RUNTIME ${rt_dir}/libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so)
    else()
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
                      OUTPUT_VARIABLE ZERO_ASAN_RUNTIME OUTPUT_STRIP_TRAILING_WHITESPACE)
    endif()
    file(WRITE ${CMAKE_BINARY_DIR}/zero_asan_runtime.txt "${ZERO_ASAN_RUNTIME}\n")
  endif()

  # The run-time defaults, linked into every executable once all targets exist (a static
  # archive of each layer must not carry them: libzerort.so takes the layers whole).
  add_library(zero_sanitize_defaults OBJECT ${CMAKE_CURRENT_LIST_DIR}/ZeroSanitizeDefaults.cc)
  target_compile_definitions(zero_sanitize_defaults PRIVATE
    ZERO_SANITIZE_$<UPPER_CASE:${ZERO_SANITIZE}>=1)

  # Every executable target under `dir`, recursively.
  function(zero_sanitize_executables dir out)
    set(found)
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "EXECUTABLE")
        list(APPEND found ${target})
      endif()
    endforeach()
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    foreach(subdir IN LISTS subdirs)
      zero_sanitize_executables(${subdir} more)
      list(APPEND found ${more})
    endforeach()
    set(${out} ${found} PARENT_SCOPE)
  endfunction()

  # Runs at the end of the top-level CMakeLists.txt, when every target and test is defined.
  function(zero_sanitize_finish)
    zero_sanitize_executables(${PROJECT_SOURCE_DIR} executables)
    foreach(target IN LISTS executables)
      target_link_libraries(${target} PRIVATE zero_sanitize_defaults)
    endforeach()
    if(ZERO_SANITIZE STREQUAL "thread" AND EXISTS ${PROJECT_SOURCE_DIR}/tests/CMakeLists.txt
       AND ZERO_BUILD_TESTS)
      # gtest_discover_tests leaves, at CTest time, the list of each binary's cases in the
      # variable <target>_TESTS (its documented TEST_LIST default). A CTest include file that
      # runs after the discovery files of tests/ labels those cases `tsan` and gives them
      # ZERO_CPU_THREADS=1 (see the top of this file).
      set(script ${CMAKE_BINARY_DIR}/zero_sanitize_tsan_tests.cmake)
      file(WRITE ${script} "# Generated by cmake/ZeroSanitize.cmake: the TSan cases.\n")
      foreach(target IN LISTS ZERO_SANITIZE_TSAN_TESTS)
        file(APPEND ${script}
          "foreach(t IN LISTS ${target}_TESTS)\n"
          "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"unit;tsan\" ENVIRONMENT ZERO_CPU_THREADS=1)\n"
          "endforeach()\n")
      endforeach()
      set_property(DIRECTORY ${PROJECT_SOURCE_DIR}/tests APPEND PROPERTY TEST_INCLUDE_FILES ${script})
    endif()
  endfunction()
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL zero_sanitize_finish)
endif()
