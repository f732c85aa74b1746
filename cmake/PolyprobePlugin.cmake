# polyprobe_add_plugin(NAME [OUTPUT_DIRECTORY DIR] [NO_INSTALL] SOURCES...): a plugin module,
# libpolyprobe_NAME.so, that sees only the plugin SDK (polyprobe::plugin_api, never the
# core). It is built into <build>/<plugin subdir> (the build tree mirrors the install tree)
# or DIR, and installed into <prefix>/<plugin subdir> unless NO_INSTALL.
#
# The same file serves polyprobe's own tree and the installed package (polyprobeConfig.cmake
# includes it): in-tree POLYPROBE_PLUGIN_SUBDIR names the plugin folder; from an install,
# polyprobe_PLUGIN_SUBDIR (set by the package) does, else lib/polyprobe/plugins.
include_guard(GLOBAL)

function(polyprobe_add_plugin name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_INSTALL" "OUTPUT_DIRECTORY" "")
  if(NOT arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "polyprobe_add_plugin(${name}): no sources")
  endif()
  if(DEFINED POLYPROBE_PLUGIN_SUBDIR)
    set(subdir ${POLYPROBE_PLUGIN_SUBDIR})
  elseif(DEFINED polyprobe_PLUGIN_SUBDIR)
    set(subdir ${polyprobe_PLUGIN_SUBDIR})
  else()
    set(subdir lib/polyprobe/plugins)
  endif()
  if(arg_OUTPUT_DIRECTORY)
    set(out ${arg_OUTPUT_DIRECTORY})
  else()
    set(out ${CMAKE_BINARY_DIR}/${subdir})
  endif()
  add_library(${name} MODULE ${arg_UNPARSED_ARGUMENTS})
  if(TARGET polyprobe_plugin_api)  # polyprobe's own tree
    target_link_libraries(${name} PRIVATE polyprobe_plugin_api)
  else()
    target_link_libraries(${name} PRIVATE polyprobe::plugin_api)
  endif()
  if(TARGET polyprobe_build_flags)
    target_link_libraries(${name} PRIVATE polyprobe_build_flags)
  endif()
  set_target_properties(${name} PROPERTIES
    PREFIX "libpolyprobe_"
    LIBRARY_OUTPUT_DIRECTORY ${out}
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  # Undefined symbols in a plugin are a link error here, not a load failure for users.
  target_link_options(${name} PRIVATE -Wl,--no-undefined)
  if(NOT arg_NO_INSTALL)
    install(TARGETS ${name} LIBRARY DESTINATION ${subdir} COMPONENT plugins)
  endif()
endfunction()
