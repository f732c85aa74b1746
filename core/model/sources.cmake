target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_factory.cpp)
