// The tensor names a checkpoint holds (from model.safetensors.index.json, or from the shard headers, which
// add dtypes), sorted so that "every tensor under this weight's base name" is one range lookup.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kimirt/tensor/dtype.h"

namespace kimirt::model {

struct KeyEntry {
  std::string name;
  std::optional<DType> dtype;  // known once a shard header has been read
  std::string file = {};       // the shard holding it, when known (named in format errors)
};

class KeyIndex {
 public:
  KeyIndex() = default;
  explicit KeyIndex(std::vector<KeyEntry> entries);
  // Names only (an index file's weight_map keys).
  template <typename Range>
  static KeyIndex from_names(const Range& names) {
    std::vector<KeyEntry> e;
    for (const auto& n : names) e.push_back({std::string(n), std::nullopt});
    return KeyIndex(std::move(e));
  }

  bool contains(std::string_view name) const;
  std::optional<DType> dtype(std::string_view name) const;
  // Entries whose name starts with `prefix`, in name order.
  std::span<const KeyEntry> with_prefix(std::string_view prefix) const;
  std::span<const KeyEntry> entries() const { return entries_; }
  bool any_with_prefix(std::string_view prefix) const { return !with_prefix(prefix).empty(); }

 private:
  std::vector<KeyEntry> entries_;
};

}  // namespace kimirt::model
