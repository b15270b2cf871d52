# Build options ZERO_CUDA and ZERO_MPI, each AUTO|ON|OFF.
#   AUTO: use the CUDA toolkit (/usr/local/cuda) / OpenMPI when found, else build without.
#   ON:   require it; configuration fails with a message saying what is missing.
#   OFF:  do not look.
# Results: ZERO_HAVE_CUDA and ZERO_HAVE_MPI (ON/OFF), and targets CUDA::cudart, MPI::MPI_C.
#
# Also here, from their own files:
#   ZERO_SANITIZE   "" | address | thread   sanitizer builds (cmake/ZeroSanitize.cmake)
#   ZERO_BUILD_FUZZ OFF | ON                 libFuzzer targets, clang only (tests/fuzz/)

set(ZERO_CUDA AUTO CACHE STRING "Build the CUDA kernels and backends: AUTO, ON or OFF")
set_property(CACHE ZERO_CUDA PROPERTY STRINGS AUTO ON OFF)
set(ZERO_MPI AUTO CACHE STRING "Build the MPI communicator: AUTO, ON or OFF")
set_property(CACHE ZERO_MPI PROPERTY STRINGS AUTO ON OFF)

foreach(option ZERO_CUDA ZERO_MPI)
  if(NOT ${option} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${option}=${${option}}: expected AUTO, ON or OFF")
  endif()
endforeach()

set(ZERO_HAVE_CUDA OFF)
if(NOT ZERO_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # sm_90 machine code plus compute_90 PTX
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    find_package(CUDAToolkit REQUIRED)
    set(ZERO_HAVE_CUDA ON)
  elseif(ZERO_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZERO_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit "
                        "at /usr/local/cuda or set CMAKE_CUDA_COMPILER")
  endif()
endif()

set(ZERO_HAVE_MPI OFF)
if(NOT ZERO_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(ZERO_HAVE_MPI ON)
  elseif(ZERO_MPI STREQUAL "ON")
    message(FATAL_ERROR "ZERO_MPI=ON but no MPI was found: install libopenmpi-dev and "
                        "openmpi-bin (scripts/setup.sh does)")
  endif()
endif()

message(STATUS "ZeroRT: CUDA ${ZERO_HAVE_CUDA} (ZERO_CUDA=${ZERO_CUDA}), "
               "MPI ${ZERO_HAVE_MPI} (ZERO_MPI=${ZERO_MPI})")

# Sanitizer builds (ZERO_SANITIZE) and the fuzz targets' option (ZERO_BUILD_FUZZ).
include(${CMAKE_CURRENT_LIST_DIR}/ZeroSanitize.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/ZeroFuzz.cmake)
