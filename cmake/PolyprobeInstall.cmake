# `cmake --install` yields a package usable with find_package(polyprobe CONFIG): the core
# library, the public headers, the plugin API target and the host app with its plugins.
include(CMakePackageConfigHelpers)
# Exported as polyprobe::core and polyprobe::plugin_api, the names used in-tree too.
set_target_properties(polyprobe_core PROPERTIES EXPORT_NAME core)
set_target_properties(polyprobe_plugin_api PROPERTIES EXPORT_NAME plugin_api)
# Two export sets, so that the package can define the header-only plugin API without the
# core's dependencies (polyprobeConfig.cmake looks for Eigen and nlohmann_json only for the
# core).
install(TARGETS polyprobe_plugin_api EXPORT polyprobePluginApiTargets
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS polyprobe_core EXPORT polyprobeCoreTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The SDK's headers in their own folder, the only one on a plugin's include path
# (polyprobe::plugin_api); the core's beside them.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/polyprobe/plugin
        DESTINATION ${POLYPROBE_SDK_INCLUDEDIR}/polyprobe)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/polyprobe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        PATTERN plugin EXCLUDE)
install(EXPORT polyprobePluginApiTargets NAMESPACE polyprobe::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/polyprobe)
install(EXPORT polyprobeCoreTargets NAMESPACE polyprobe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/polyprobe)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/polyprobeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/polyprobeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/polyprobe)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/polyprobeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/polyprobeConfig.cmake ${PROJECT_BINARY_DIR}/polyprobeConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/PolyprobePlugin.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/polyprobe)
