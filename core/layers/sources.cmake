target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/builtin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/elementwise.cpp)
