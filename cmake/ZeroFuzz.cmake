# ZERO_BUILD_FUZZ (default OFF): the libFuzzer targets of tests/fuzz/ (CTest label `fuzz`).
#
# libFuzzer comes with clang (Debian: clang, libclang-rt-14-dev; OpenMP for clang: libomp-dev),
# so the option needs CMAKE_CXX_COMPILER_ID Clang: configure a separate build directory with
# CC=clang CXX=clang++ (`make fuzz` does, with ZERO_SANITIZE=address so every input also runs
# under ASan + UBSan). Every C/C++ target of that build is compiled with
# -fsanitize=fuzzer-no-link: the library's code (the config parser, the checkpoint reader, and
# everything they call) carries the coverage counters that guide the fuzzer; the fuzz targets
# themselves link with -fsanitize=fuzzer (libFuzzer's main).
option(ZERO_BUILD_FUZZ "Build the libFuzzer targets in tests/fuzz (clang only)" OFF)
set(ZERO_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz-labelled CTest test fuzzes its target")

if(ZERO_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ZERO_BUILD_FUZZ=ON needs clang (libFuzzer): configure with "
                        "CC=clang CXX=clang++ in a build directory of its own (make fuzz does); "
                        "Debian packages: clang libclang-rt-14-dev libomp-dev")
  endif()
  if(NOT ZERO_SANITIZE STREQUAL "address")
    message(WARNING "ZERO_BUILD_FUZZ=ON without ZERO_SANITIZE=address: inputs run without ASan/UBSan, "
                    "so only crashes, aborts and escaping exceptions are found")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
  message(STATUS "ZeroRT: fuzz targets ON (${ZERO_FUZZ_SECONDS} s per fuzz test)")
endif()
