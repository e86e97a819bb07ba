#include "kimirt/model/param_store.h"

#include "kimirt/base/error.h"
#include "kimirt/quant/dequant.h"

namespace kimirt::model {

const Tensor* LoadedParam::component(int component_id) const {
  for (size_t i = 0; i < component_ids.size(); ++i) {
    if (component_ids[i] == component_id) return &components[i];
  }
  return nullptr;
}

Tensor LoadedParam::to_f32() const {
  const std::string name = spec ? spec->name : std::string("<unnamed parameter>");
  const auto all = quant::format_components(format);
  std::vector<TensorView> parts(all.size());
  for (size_t i = 0; i < component_ids.size(); ++i) {
    KIMIRT_CHECK(component_ids[i] >= 0 && static_cast<size_t>(component_ids[i]) < all.size(),
                 "{}: component id {} out of range for format {}", name, component_ids[i],
                 quant::format_name(format));
    parts[static_cast<size_t>(component_ids[i])] = components[i].view();
  }
  return quant::dequantize(format, parts, shape, name);
}

void ParamStore::put(std::string name, LoadedParam param) {
  KIMIRT_CHECK(params_.find(name) == params_.end(), "parameter {} loaded twice", name);
  params_.emplace(std::move(name), std::move(param));
}

const LoadedParam* ParamStore::find(std::string_view name) const {
  auto it = params_.find(name);
  return it == params_.end() ? nullptr : &it->second;
}

const LoadedParam& ParamStore::at(std::string_view name) const {
  const LoadedParam* p = find(name);
  KIMIRT_CHECK(p != nullptr, "parameter {} was not loaded", name);
  return *p;
}

uint64_t ParamStore::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, p] : params_) {
    for (const auto& c : p.components) total += c.nbytes();
  }
  return total;
}

}  // namespace kimirt::model
