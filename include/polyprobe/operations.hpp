// The host's named operations: the kernel registry of the plugin ABI
// (plugin/operations.h). Plugins offer operations by well-known name ("sdpa"), device and
// dtypes; the table keeps the usable ones and hands out the best for (name, device name,
// dtype) to the host's layers and, as a pp_host_api (SessionOperations), to evaluator
// sessions. A lookup that finds nothing means "compute it yourself": every caller has its
// own explicit version.
//
// Threading: filled from one thread while plugins load, read-only afterwards; lookups may
// then come from any thread. Entries point into plugins, which are never unloaded.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace polyprobe {

class OperationTable {
 public:
  struct Entry {
    const pp_operation* op = nullptr;  // never null in a table
    std::string provider;              // the plugin's name
    std::string device;                // the name of the device it runs on: "cpu", "cuda", ...
  };

  OperationTable() = default;
  OperationTable(const OperationTable&) = delete;
  OperationTable& operator=(const OperationTable&) = delete;

  // Adds `op` of plugin `provider` if its device is valid and its probe (when it has one)
  // finds it usable; else returns why not. Adding the same op twice is a no-op.
  std::string add(const pp_operation* op, const std::string& provider);
  // The best operation `name` for (device, dtype), `device` a device name ("cpu", "cuda",
  // ...): the highest score, then the provider's name; nullptr when none is loaded.
  const Entry* find(std::string_view name, std::string_view device, int32_t dtype) const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

// The table as one evaluator session sees it (pp_session_options.host): find_operation's
// device type means "cpu" for PP_DEVICE_TYPE_CPU and the session's own device for the
// session's type. Keeps the table alive; stays at one address (the api's ctx is `this`).
class SessionOperations {
 public:
  SessionOperations(std::shared_ptr<const OperationTable> table, int32_t device_type,
                    std::string device_name);
  SessionOperations(const SessionOperations&) = delete;
  SessionOperations& operator=(const SessionOperations&) = delete;
  const pp_host_api* host_api() const { return &api_; }
  // The device name a pp_device_type resolves to for this session; empty when none.
  std::string_view device_of(int32_t device_type) const;
  const OperationTable& table() const { return *table_; }

 private:
  std::shared_ptr<const OperationTable> table_;
  int32_t device_type_;
  std::string device_name_;
  pp_host_api api_{};
};

// The name of the device of a pp_device_type and a declared name (NULL = "cpu"), as
// capabilities and operations declare them; empty when the pair is not valid (a name of
// lower case letters, digits, '_' and '-', at most 32; "cpu" if and only if the type is
// PP_DEVICE_TYPE_CPU; a known type).
std::string device_name_of(int32_t device_type, const char* device_name);
// "cpu", "gpu", "accelerator" (or "device_type#N" for an unknown one).
std::string device_type_label(int32_t device_type);

// A one-line description of the operation `find` chose, for --explain: "sdpa (cpu,
// float32) from attention_sdpa", or "explicit (no sdpa operation loaded for cpu, float32)".
std::string describe_choice(const OperationTable::Entry* chosen, std::string_view name,
                            std::string_view device, int32_t dtype);

}  // namespace polyprobe
