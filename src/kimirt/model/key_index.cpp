#include "kimirt/model/key_index.h"

#include <algorithm>

#include "kimirt/base/error.h"

namespace kimirt::model {
namespace {

bool by_name(const KeyEntry& a, const KeyEntry& b) { return a.name < b.name; }

}  // namespace

KeyIndex::KeyIndex(std::vector<KeyEntry> entries) : entries_(std::move(entries)) {
  std::sort(entries_.begin(), entries_.end(), by_name);
  for (size_t i = 1; i < entries_.size(); ++i) {
    KIMIRT_CHECK(entries_[i].name != entries_[i - 1].name, "tensor {} is listed twice", entries_[i].name);
  }
}

bool KeyIndex::contains(std::string_view name) const {
  const auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                                   [](const KeyEntry& e, std::string_view n) { return e.name < n; });
  return it != entries_.end() && it->name == name;
}

std::optional<DType> KeyIndex::dtype(std::string_view name) const {
  const auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                                   [](const KeyEntry& e, std::string_view n) { return e.name < n; });
  if (it == entries_.end() || it->name != name) return std::nullopt;
  return it->dtype;
}

std::span<const KeyEntry> KeyIndex::with_prefix(std::string_view prefix) const {
  const auto first = std::lower_bound(entries_.begin(), entries_.end(), prefix,
                                      [](const KeyEntry& e, std::string_view p) { return e.name < p; });
  auto last = first;
  while (last != entries_.end() && std::string_view(last->name).starts_with(prefix)) ++last;
  return {first, last};
}

}  // namespace kimirt::model
