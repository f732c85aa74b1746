message(STATUS "polyprobe ${PROJECT_VERSION}: build type ${CMAKE_BUILD_TYPE}, "
               "CUDA plugins ${POLYPROBE_HAVE_CUDA}, Python ${POLYPROBE_HAVE_PYTHON}, "
               "MPI ranks ${POLYPROBE_HAVE_MPI}, NCCL losses ${POLYPROBE_HAVE_NCCL}, "
               "NLopt baselines of bench dfo ${POLYPROBE_HAVE_NLOPT}, sanitizers ${POLYPROBE_SANITIZE}, "
               "werror ${POLYPROBE_WERROR}, tests ${POLYPROBE_BUILD_TESTS}")
