// The host's named operations (operations.hpp).
#include <polyprobe/operations.hpp>

#include "plugin/plugin_impl.hpp"

#include <algorithm>
#include <cstring>

namespace polyprobe {
namespace {

const pp_operation* find_operation(const void* ctx, const char* name, int32_t device,
                                   int32_t dtype) {
  if (ctx == nullptr || name == nullptr) return nullptr;
  const auto* session = static_cast<const SessionOperations*>(ctx);
  const std::string_view device_name = session->device_of(device);
  if (device_name.empty()) return nullptr;
  const auto* entry = session->table().find(name, device_name, dtype);
  return entry == nullptr ? nullptr : entry->op;
}

const char* operation_provider(const void* ctx, const pp_operation* op) {
  if (ctx != nullptr)
    for (const auto& entry : static_cast<const SessionOperations*>(ctx)->table().entries())
      if (entry.op == op) return entry.provider.c_str();
  return "unknown";
}

bool valid_device_name(std::string_view name) {
  return !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

}  // namespace

std::string device_name_of(int32_t device_type, const char* device_name) {
  if (device_type != PP_DEVICE_TYPE_CPU && device_type != PP_DEVICE_TYPE_GPU &&
      device_type != PP_DEVICE_TYPE_ACCELERATOR)
    return {};
  std::string name = device_name == nullptr ? PP_DEVICE_NAME_CPU : device_name;
  if (!valid_device_name(name)) return {};
  if ((name == PP_DEVICE_NAME_CPU) != (device_type == PP_DEVICE_TYPE_CPU)) return {};
  return name;
}

std::string device_type_label(int32_t device_type) {
  switch (device_type) {
    case PP_DEVICE_TYPE_CPU:
      return "cpu";
    case PP_DEVICE_TYPE_GPU:
      return "gpu";
    case PP_DEVICE_TYPE_ACCELERATOR:
      return "accelerator";
    default:
      return "device_type#" + std::to_string(device_type);
  }
}

SessionOperations::SessionOperations(std::shared_ptr<const OperationTable> table,
                                     int32_t device_type, std::string device_name)
    : table_(std::move(table)), device_type_(device_type), device_name_(std::move(device_name)) {
  api_.struct_size = sizeof(api_);
  api_.ctx = this;
  api_.find_operation = &find_operation;
  api_.operation_provider = &operation_provider;
}

std::string_view SessionOperations::device_of(int32_t device_type) const {
  if (device_type == PP_DEVICE_TYPE_CPU) return PP_DEVICE_NAME_CPU;
  if (device_type == device_type_) return device_name_;
  return {};
}

std::string OperationTable::add(const pp_operation* op, const std::string& provider) {
  if (op == nullptr || op->struct_size < sizeof(pp_operation) || op->name == nullptr ||
      op->table == nullptr || op->score <= 0)
    return "an incomplete operation (no name, table or positive score)";
  std::string device = device_name_of(op->device, op->device_name);
  if (device.empty())
    return "no valid device (type " + device_type_label(op->device) + ", name '" +
           (op->device_name == nullptr ? "NULL" : std::string(op->device_name).substr(0, 40)) +
           "')";
  for (const Entry& e : entries_)
    if (e.op == op) return {};
  if (op->probe != nullptr) {
    pp_error why{};
    if (op->probe(&why) <= 0) return "unusable on this machine: " + detail::error_text(why);
  }
  entries_.push_back({op, provider, std::move(device)});
  return {};
}

const OperationTable::Entry* OperationTable::find(std::string_view name, std::string_view device,
                                                  int32_t dtype) const {
  const Entry* best = nullptr;
  for (const Entry& e : entries_) {
    if (name != e.op->name || e.device != device || dtype < 0 || dtype > 31 ||
        (e.op->dtypes & PP_DTYPE_BIT(dtype)) == 0)
      continue;
    if (best == nullptr || e.op->score > best->op->score ||
        (e.op->score == best->op->score && e.provider < best->provider))
      best = &e;
  }
  return best;
}

std::string describe_choice(const OperationTable::Entry* chosen, std::string_view name,
                            std::string_view device, int32_t dtype) {
  const std::string where = std::string(device) + ", " + detail::dtype_label(dtype);
  if (chosen == nullptr)
    return "explicit (no " + std::string(name) + " operation loaded for " + where + ")";
  return std::string(name) + " (" + where + ") from " + chosen->provider;
}

}  // namespace polyprobe
