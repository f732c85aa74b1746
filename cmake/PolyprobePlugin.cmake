# polyprobe_add_plugin(NAME SOURCES...): a plugin shared library placed in the plugin folder
# of the build tree (which mirrors the install tree) and installed there. Plugins see only
# the public headers: they link polyprobe::plugin_api, never the core.
function(polyprobe_add_plugin name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE polyprobe_plugin_api polyprobe_build_flags)
  set_target_properties(${name} PROPERTIES
    PREFIX "libpolyprobe_"
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/${POLYPROBE_PLUGIN_SUBDIR}
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  # Undefined symbols in a plugin are a link error here, not a load failure for users.
  target_link_options(${name} PRIVATE -Wl,--no-undefined)
  install(TARGETS ${name} LIBRARY DESTINATION ${POLYPROBE_PLUGIN_SUBDIR} COMPONENT plugins)
endfunction()
