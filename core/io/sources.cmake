target_sources(polyprobe_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/file_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/csv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/idx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/datasets.cpp)

# The default data set is compiled in: data/digits.csv.gz becomes a byte array in a generated
# .cpp (at configure time; editing the data file re-runs CMake), so the library and the
# `polyprobe train` default never read a data file at run time.
set(_polyprobe_embedded ${PROJECT_SOURCE_DIR}/data/digits.csv.gz)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_polyprobe_embedded})
file(READ ${_polyprobe_embedded} _polyprobe_hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," EMBEDDED_BYTES "${_polyprobe_hex}")
set(EMBEDDED_SOURCE data/digits.csv.gz)
configure_file(${CMAKE_CURRENT_LIST_DIR}/embedded_data.cpp.in
               ${CMAKE_CURRENT_BINARY_DIR}/generated/embedded_data.cpp @ONLY)
target_sources(polyprobe_core PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated/embedded_data.cpp)

