target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/ask_tell.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/geometry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metric.cpp
  ${CMAKE_CURRENT_LIST_DIR}/minimize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/radius_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/row_chunks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_threads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vector_math.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vector_search.cpp)
# The vectorised exp and sincos loops: without -fno-trapping-math GCC keeps their range
# checks as branches; no contraction, so that every clone rounds alike.
set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/vector_math.cpp APPEND PROPERTY COMPILE_OPTIONS
  -fno-trapping-math -ffp-contract=off)
