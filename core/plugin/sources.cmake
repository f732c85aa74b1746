target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/abi_labels.cpp
  ${CMAKE_CURRENT_LIST_DIR}/operations.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plugin_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plugin_evaluator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_view.cpp
  ${CMAKE_CURRENT_LIST_DIR}/op_view.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plugin_accumulator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plugin_subspace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plugin_radius_model.cpp)
