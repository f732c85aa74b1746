target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train.cpp)
