# Dependencies, all from Debian's packages (README.md says why each one is here).
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options filesystem)
find_package(TBB REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
# Optional: only the NLopt baselines of `polyprobe bench dfo` use it (libnlopt-cxx-dev).
# Without it (or with -DCMAKE_DISABLE_FIND_PACKAGE_NLopt=ON) `bench dfo` runs the polyprobe
# solvers only and says so.
find_package(NLopt 2.7 QUIET)
set(POLYPROBE_HAVE_NLOPT OFF)
if(NLopt_FOUND)
  set(POLYPROBE_HAVE_NLOPT ON)
endif()
if(POLYPROBE_BUILD_TESTS)
  find_package(Catch2 2.13 REQUIRED)
endif()

# The CUDA plugins' effective state is computed once, so the build and its summary agree.
set(POLYPROBE_HAVE_CUDA OFF)
if(NOT POLYPROBE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(POLYPROBE_HAVE_CUDA ON)
  elseif(POLYPROBE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "POLYPROBE_CUDA=ON but no CUDA compiler was found; install the CUDA "
                        "Toolkit in /usr/local/cuda or configure with -DPOLYPROBE_CUDA=OFF")
  endif()
endif()

# The Python package's effective state, computed once like CUDA's: Debian's /usr/bin/python3
# (not whatever python3 is first on PATH) and pybind11-dev.
set(POLYPROBE_HAVE_PYTHON OFF)
if(NOT POLYPROBE_PYTHON STREQUAL "OFF")
  if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
  if(Python_FOUND)
    find_package(pybind11 2.6 CONFIG QUIET)
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(POLYPROBE_HAVE_PYTHON ON)
  elseif(POLYPROBE_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "POLYPROBE_PYTHON=ON but pybind11 or Python's headers were not found; "
                        "install pybind11-dev python3-dev python3-numpy (scripts/install-deps.sh) "
                        "or configure with -DPOLYPROBE_PYTHON=OFF")
  endif()
endif()

# MPI (optional, computed once like CUDA's): only distributed/ and the host app's train command
# use it; the core knows nothing of it.
set(POLYPROBE_HAVE_MPI OFF)
if(NOT POLYPROBE_MPI STREQUAL "OFF")
  find_package(MPI 3.0 COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(POLYPROBE_HAVE_MPI ON)
  elseif(POLYPROBE_MPI STREQUAL "ON")
    message(FATAL_ERROR "POLYPROBE_MPI=ON but no MPI was found; install libopenmpi-dev "
                        "openmpi-bin (scripts/install-deps.sh) or configure with -DPOLYPROBE_MPI=OFF")
  endif()
endif()
find_program(POLYPROBE_MPIEXEC NAMES mpirun mpiexec)

# NCCL (optional): the losses of GPU ranks all-gathered between device buffers. Needs MPI (to
# bootstrap) and the CUDA Toolkit with libnccl.
set(POLYPROBE_HAVE_NCCL OFF)
if(NOT POLYPROBE_NCCL STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_path(POLYPROBE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(POLYPROBE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(POLYPROBE_HAVE_MPI AND CUDAToolkit_FOUND AND POLYPROBE_NCCL_INCLUDE_DIR AND POLYPROBE_NCCL_LIBRARY)
    set(POLYPROBE_HAVE_NCCL ON)
  elseif(POLYPROBE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "POLYPROBE_NCCL=ON needs MPI, the CUDA Toolkit and libnccl "
                        "(/usr/local/cuda/include/nccl.h, /usr/local/cuda/lib64/libnccl.so); "
                        "or configure with -DPOLYPROBE_NCCL=OFF")
  endif()
endif()
