// This rank's parameters as the loader hands them over, before any backend touches them: each in its
// storage format (quantized weights stay quantized), one tensor per stored component (data, block scales,
// global scale), already sliced for this rank and, for fused parameters (gate_up_proj), concatenated in
// source order. The CPU backend dequantizes to fp32 from here; the GPU backend uploads from here or,
// for the streaming path, receives the same bytes through the loader's upload interface.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/model/schema.h"
#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::model {

struct LoadedParam {
  const ParamSpec* spec = nullptr;  // points into the Schema the store was loaded for
  quant::WeightFormat format = quant::WeightFormat::kFloat;
  Shape shape;                     // this rank's logical shape
  std::vector<int> component_ids;  // index into quant::format_components(format), per tensor below
  std::vector<Tensor> components;  // canonical form (Schema::normalize), this rank's slice

  // The tensor of component `component_id`, or nullptr when it is not stored.
  const Tensor* component(int component_id) const;
  // The fp32 weight in its logical shape (dequantized when quantized).
  Tensor to_f32() const;
};

class ParamStore {
 public:
  // Throws when the name is taken: a parameter is filled exactly once.
  void put(std::string name, LoadedParam param);
  const LoadedParam* find(std::string_view name) const;
  // Throws naming the parameter when it is absent.
  const LoadedParam& at(std::string_view name) const;
  size_t size() const { return params_.size(); }
  uint64_t total_bytes() const;
  const std::map<std::string, LoadedParam, std::less<>>& params() const { return params_; }

 private:
  std::map<std::string, LoadedParam, std::less<>> params_;
};

}  // namespace kimirt::model
