// The random values of one generated checkpoint tensor (tiny_checkpoint.h says which distribution each
// parameter gets), produced in chunks so that a tensor of any size is written without holding it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "kimirt/model/schema.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::model {

// One stored tensor: component `component` of source `source` of `spec`, stored as `dtype` `shape`.
struct TinyTensor {
  std::string_view key;
  DType dtype;
  Shape shape;
  const ParamSpec* spec;
  size_t source;
  int component;
};

// Calls `out` with the tensor's bytes, in order, in chunks. The values depend only on `seed` and the names.
void generate_tiny_tensor(const TinyTensor& tensor, uint64_t seed, const std::function<void(const void*, size_t)>& out);

}  // namespace kimirt::model
