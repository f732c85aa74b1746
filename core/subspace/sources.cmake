target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/subspace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rank_one_subspace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hybrid_subspace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/subspace_kinds.cpp)
