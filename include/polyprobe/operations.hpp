// The host's named operations: the kernel registry of the plugin ABI
// (plugin/operations.h). Plugins offer operations by well-known name ("sdpa"), device and
// dtypes; the table keeps the usable ones and hands out the best for (name, device, dtype)
// to the host's layers and, as a pp_host_api, to evaluator sessions. A lookup that finds
// nothing means "compute it yourself": every caller has its own explicit version.
//
// Threading: filled from one thread while plugins load, read-only afterwards; lookups may
// then come from any thread. Entries point into plugins, which are never unloaded.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <string>
#include <string_view>
#include <vector>

namespace polyprobe {

class OperationTable {
 public:
  struct Entry {
    const pp_operation* op = nullptr;  // never null in a table
    std::string provider;              // the plugin's name
  };

  OperationTable();
  OperationTable(const OperationTable&) = delete;
  OperationTable& operator=(const OperationTable&) = delete;

  // Adds `op` of plugin `provider` if its probe (when it has one) finds it usable; else
  // returns why not. Adding the same op twice is a no-op.
  std::string add(const pp_operation* op, const std::string& provider);
  // The best operation `name` for (device, dtype): the highest score, then the provider's
  // name; nullptr when none is loaded.
  const Entry* find(std::string_view name, int32_t device, int32_t dtype) const;
  const std::vector<Entry>& entries() const { return entries_; }
  // A view of this table for plugin sessions; valid while the table lives.
  const pp_host_api* host_api() const { return &api_; }

 private:
  std::vector<Entry> entries_;
  pp_host_api api_{};
};

// A one-line description of the operation `find` chose, for --explain: "sdpa (cpu,
// float32) from attention_sdpa", or "explicit (no sdpa operation loaded for cpu, float32)".
std::string describe_choice(const OperationTable::Entry* chosen, std::string_view name,
                            int32_t device, int32_t dtype);

}  // namespace polyprobe
