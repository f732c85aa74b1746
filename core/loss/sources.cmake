target_sources(polyprobe_core PRIVATE ${CMAKE_CURRENT_LIST_DIR}/losses.cpp)
