target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/file_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_file.cpp)
