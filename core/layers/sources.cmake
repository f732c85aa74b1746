target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/builtin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/elementwise.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_norm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/conv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/moe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lif.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cheri.cpp)
