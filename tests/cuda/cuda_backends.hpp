// What every cuda test shares: the plugins of the build (the cuda plugin among them) and the
// skip for a machine without a usable device.
#pragma once

#include <polyprobe/layer.hpp>
#include <polyprobe/registry.hpp>

#include <cstdio>
#include <cstdlib>

namespace polyprobe::testing {

struct Backends {
  PluginRegistry registry;
  LayerFactory factory = LayerFactory::with_builtins();
  Backends() { registry.load_directories({PluginRegistry::executable_plugin_dir()}); }
  const PluginInfo* cuda() const {
    for (const PluginInfo& info : registry.plugins())
      if (info.name == "cuda") return &info;
    return nullptr;
  }
};

inline Backends& backends() {
  static Backends b;
  return b;
}

// Skips the calling case (exit 77, ctest's SKIP_RETURN_CODE) when no device is usable.
inline void require_device() {
  const PluginInfo* info = backends().cuda();
  if (info != nullptr && info->available) return;
  std::fprintf(stderr, "SKIPPED: no usable CUDA device: %s\n",
               info == nullptr ? "the cuda plugin was not found" : info->reason.c_str());
  std::fflush(stderr);
  std::exit(77);
}

}  // namespace polyprobe::testing
