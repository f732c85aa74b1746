# Every user-facing build option, in one place.
option(POLYPROBE_BUILD_TESTS "Build the test suite" ON)
option(POLYPROBE_WERROR "Treat compiler warnings as errors (CI turns this on)" OFF)
option(POLYPROBE_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang; fuzz/run.sh sets it)" OFF)
option(POLYPROBE_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
set(POLYPROBE_CUDA "AUTO" CACHE STRING "Build the CUDA plugins: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE POLYPROBE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(POLYPROBE_PYTHON "AUTO" CACHE STRING
    "Build the Python package (python/): AUTO (when pybind11 and Debian's python3 are found), ON or OFF")
set_property(CACHE POLYPROBE_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(POLYPROBE_MPI "AUTO" CACHE STRING
    "Build polyprobe_distributed (candidates sharded over MPI ranks): AUTO (when CMake finds MPI), ON or OFF")
set_property(CACHE POLYPROBE_MPI PROPERTY STRINGS AUTO ON OFF)
set(POLYPROBE_NCCL "AUTO" CACHE STRING
    "Carry the losses of GPU ranks over NCCL (needs MPI and the CUDA Toolkit's libnccl): AUTO, ON or OFF")
set_property(CACHE POLYPROBE_NCCL PROPERTY STRINGS AUTO ON OFF)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
# Hidden by default: a plugin exports its one entry symbol, the core its public API.
set(CMAKE_CXX_VISIBILITY_PRESET hidden)
set(CMAKE_C_VISIBILITY_PRESET hidden)
set(CMAKE_VISIBILITY_INLINES_HIDDEN ON)

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_C_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()
option(POLYPROBE_TEST_NLOPT_OFF
       "Register the ctest that builds the host a second time without NLopt (minutes on a cold cache)"
       OFF)
