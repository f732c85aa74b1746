# Warnings and sanitizers as an interface target that every first-party target links.
add_library(polyprobe_build_flags INTERFACE)
target_compile_options(polyprobe_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Wimplicit-fallthrough>)
# -Wold-style-cast and -Wnon-virtual-dtor do not apply to C.
target_compile_options(polyprobe_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:C>:-Wno-old-style-cast -Wno-non-virtual-dtor>)
if(POLYPROBE_WERROR)
  target_compile_options(polyprobe_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX,C>:-Werror>)
endif()
if(POLYPROBE_SANITIZE)
  target_compile_options(polyprobe_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(polyprobe_build_flags INTERFACE -fsanitize=address,undefined)
endif()
