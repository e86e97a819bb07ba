// The checkpoint's declared quantization (config.json `quantization_config`), as data. What it declares
// predicts the routed experts' storage; the format of every tensor is still decided from the tensors
// themselves (quant::detect_weight_format), because the declared ignore lists do not match what releases
// actually store (spec model-architecture §1.2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/quant/weight_format.h"

namespace kimirt::model {

enum class QuantMethod : uint8_t {
  kNone,
  kMxfp4,     // compressed-tensors mxfp4-pack-quantized, E8M0 scale per 32
  kFp8Block,  // FP8 E4M3 with 128x128 block scales
  kNvfp4,     // E2M1 with an E4M3 scale per 16 and an F32 global scale
};

// Who wrote the quantization_config; it fixes the tensor names (weight_scale vs weight_scale_inv, ...).
enum class QuantProvider : uint8_t {
  kNone,
  kCompressedTensors,  // quant_method "compressed-tensors"
  kDeepSeekFp8,        // quant_method "fp8" with weight_block_size
  kModelOpt,           // quant_method "modelopt"
};

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kNone;
  QuantProvider provider = QuantProvider::kNone;
  int64_t group_size = 0;            // MXFP4: 32, NVFP4: 16
  int64_t block_rows = 0;            // FP8: 128
  int64_t block_cols = 0;            // FP8: 128
  std::vector<std::string> targets;  // compressed-tensors group targets (["Linear"])
  std::vector<std::string> ignore;   // compressed-tensors "ignore" / ModelOpt "exclude_modules"
  bool modelopt_mixed = false;       // ModelOpt quant_algo MIXED_PRECISION (per-layer quantized_layers)

  bool operator==(const QuantizationConfig&) const = default;

  // The stored format this declaration gives the routed experts (kFloat when nothing is declared).
  quant::WeightFormat expert_format() const;

  // The released Kimi K3 block: compressed-tensors MXFP4 group 32 with its six ignore patterns.
  static QuantizationConfig kimi_k3_mxfp4();
  static QuantizationConfig fp8_block(QuantProvider provider);
  static QuantizationConfig nvfp4(QuantProvider provider);
};

// Parses a quantization_config object found in file `source` at `path` ("text_config.quantization_config").
// Declarations kimirt does not implement (INT4 pack-quantized, asymmetric, other block sizes, ...) are
// refused, naming the field.
QuantizationConfig parse_quantization_config(const nlohmann::json& j, const std::string& source,
                                             const std::string& path);

// Writes the canonical quantization_config of its provider. `expert_modules` lists the routed-expert
// module names for a ModelOpt MIXED_PRECISION declaration (its quantized_layers); ignored otherwise.
nlohmann::json quantization_config_to_json(const QuantizationConfig& q,
                                           const std::vector<std::string>& expert_modules = {});

}  // namespace kimirt::model
