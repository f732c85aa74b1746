// The host's named operations (operations.hpp).
#include <polyprobe/operations.hpp>

#include "plugin/plugin_impl.hpp"

#include <cstring>

namespace polyprobe {
namespace {

const pp_operation* find_operation(const void* ctx, const char* name, int32_t device,
                                   int32_t dtype) {
  if (ctx == nullptr || name == nullptr) return nullptr;
  const auto* entry = static_cast<const OperationTable*>(ctx)->find(name, device, dtype);
  return entry == nullptr ? nullptr : entry->op;
}

const char* operation_provider(const void* ctx, const pp_operation* op) {
  if (ctx != nullptr)
    for (const auto& entry : static_cast<const OperationTable*>(ctx)->entries())
      if (entry.op == op) return entry.provider.c_str();
  return "unknown";
}

}  // namespace

OperationTable::OperationTable() {
  api_.struct_size = sizeof(api_);
  api_.ctx = this;
  api_.find_operation = &find_operation;
  api_.operation_provider = &operation_provider;
}

std::string OperationTable::add(const pp_operation* op, const std::string& provider) {
  if (op == nullptr || op->struct_size < sizeof(pp_operation) || op->name == nullptr ||
      op->table == nullptr || op->score <= 0)
    return "an incomplete operation (no name, table or positive score)";
  for (const Entry& e : entries_)
    if (e.op == op) return {};
  if (op->probe != nullptr) {
    pp_error why{};
    if (op->probe(&why) <= 0) return "unusable on this machine: " + detail::error_text(why);
  }
  entries_.push_back({op, provider});
  return {};
}

const OperationTable::Entry* OperationTable::find(std::string_view name, int32_t device,
                                                  int32_t dtype) const {
  const Entry* best = nullptr;
  for (const Entry& e : entries_) {
    if (name != e.op->name || e.op->device != device || dtype < 0 || dtype > 31 ||
        (e.op->dtypes & PP_DTYPE_BIT(dtype)) == 0)
      continue;
    if (best == nullptr || e.op->score > best->op->score ||
        (e.op->score == best->op->score && e.provider < best->provider))
      best = &e;
  }
  return best;
}

std::string describe_choice(const OperationTable::Entry* chosen, std::string_view name,
                            int32_t device, int32_t dtype) {
  const std::string where = detail::device_label(device) + ", " + detail::dtype_label(dtype);
  if (chosen == nullptr)
    return "explicit (no " + std::string(name) + " operation loaded for " + where + ")";
  return std::string(name) + " (" + where + ") from " + chosen->provider;
}

}  // namespace polyprobe
