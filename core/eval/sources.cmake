target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/candidates.cpp
  ${CMAKE_CURRENT_LIST_DIR}/evaluator_session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reference_evaluator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reference_accumulator.cpp)
