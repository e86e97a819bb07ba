// Every parameter a config implies, as data: runtime name, checkpoint tensor(s), logical shape, the formats
// it may be stored in, and its role (layer, op, expert). The load plan joins this with a checkpoint's
// index before reading a byte; model/parallel turns each entry into the slice a rank holds.
//
// Names: a parameter's runtime name is its checkpoint name without the `language_model.` prefix, with the
// dense MLP always under `mlp.` and gate/up fused into one `gate_up_proj` (gate rows first). Its checkpoint
// keys are `<prefix><base>.<component>` for each of its sources: the prefix and the dense-MLP spelling are a
// CheckpointLayout (detected from the key set), the components follow the source's storage format.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/model/config.h"
#include "kimirt/model/key_index.h"
#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::model {

enum class ParamRole : uint8_t {
  // Model level.
  kEmbed,
  kFinalNorm,
  kLmHead,
  kOutputResNorm,
  kOutputResProj,
  // Every layer.
  kInputNorm,
  kPostAttnNorm,
  kAttnResNorm,
  kAttnResProj,
  kMlpResNorm,
  kMlpResProj,
  // KDA.
  kKdaQ,
  kKdaK,
  kKdaV,
  kKdaG,
  kKdaGA,
  kKdaGB,
  kKdaFA,
  kKdaFB,
  kKdaB,
  kKdaQConv,
  kKdaKConv,
  kKdaVConv,
  kKdaALog,
  kKdaDtBias,
  kKdaONorm,
  kKdaO,
  // MLA.
  kMlaQ,
  kMlaQA,
  kMlaQANorm,
  kMlaQB,
  kMlaKvA,
  kMlaKvANorm,
  kMlaKvB,
  kMlaG,
  kMlaO,
  // FFN.
  kDenseGateUp,
  kDenseDown,
  kRouter,
  kRouterBias,
  kSharedGateUp,
  kSharedDown,
  kLatentDown,
  kLatentNorm,
  kLatentUp,
  kExpertW1,
  kExpertW2,
  kExpertW3,
};

std::string_view role_name(ParamRole role);  // "kda.q_proj", "moe.expert.w2", ...

// One checkpoint tensor (group) feeding a parameter; fused parameters have several, concatenated along
// dim 0 in order.
struct ParamSource {
  std::string base;  // checkpoint name without the layout prefix or component suffix: "model.layers.0.mlp.up_proj"
  Shape shape;       // logical shape of this source
  quant::WeightFormat format = quant::WeightFormat::kFloat;  // predicted from the config until resolve_formats
  uint32_t optional_present = 0;  // bit i: optional component i of `format` is in the checkpoint
};

struct ParamSpec {
  std::string name;  // runtime name
  ParamRole role;
  int32_t layer = -1;   // -1: model level
  int32_t expert = -1;  // routed expert id, -1 otherwise
  Shape shape;          // logical shape (a fused parameter stacks its sources' rows)
  bool bare = false;    // the checkpoint key is the base itself (A_log, dt_bias, e_score_correction_bias)
  quant::FormatSet formats = quant::FormatSet::float_only();  // what the checkpoint may store it as
  std::vector<ParamSource> sources;
};

enum class DenseMlpNaming : uint8_t {
  kMlp,             // model.layers.N.mlp.{gate,up,down}_proj (Moonshot's code, released checkpoints)
  kBlockSparseMoe,  // model.layers.N.block_sparse_moe.{gate,up,down}_proj (as transformers' Kimi Linear saves it)
};

struct CheckpointLayout {
  std::string prefix;  // "language_model." (Kimi K3's multimodal wrapper) or ""
  DenseMlpNaming dense_mlp = DenseMlpNaming::kMlp;
  bool operator==(const CheckpointLayout&) const = default;
};

// What a release of this family uses: Kimi K3 "language_model." + mlp, Kimi Linear "" + mlp.
CheckpointLayout default_layout(const ModelConfig& config);
// From the key set: the prefix when any key starts with "language_model." (TRT-LLM's rule), the dense-MLP
// spelling from where the first dense layer's gate_proj is; the family default for what is not there.
CheckpointLayout detect_layout(const ModelConfig& config, const KeyIndex& keys);
// The prefix of the text model's keys as detect_layout finds it: "language_model." when any key has it (K3's
// multimodal releases), else "".
std::string detect_prefix(const KeyIndex& keys);

class Schema {
 public:
  // Every parameter of `config`; storage formats predicted from its quantization_config (routed experts)
  // and float elsewhere.
  Schema(const ModelConfig& config, CheckpointLayout layout);
  // detect_layout + resolve_formats: the schema of one checkpoint.
  static Schema for_checkpoint(const ModelConfig& config, const KeyIndex& keys);

  // Fixes each weight's storage format from the tensors present under its base name (and their dtypes when
  // known). Throws naming the tensor for a format the parameter may not take (a quantized norm or router),
  // an FP8 weight without its scale, or fused gate/up halves stored differently. Weights with no tensor at
  // all keep their predicted format (the load plan reports them missing).
  void resolve_formats(const KeyIndex& keys);

  const ModelConfig& config() const { return config_; }
  const CheckpointLayout& layout() const { return layout_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  // nullptr when there is no parameter of that runtime name.
  const ParamSpec* find(std::string_view name) const;

  // The checkpoint key of one component of a source.
  std::string key(const ParamSpec& spec, const ParamSource& source, const quant::Component& component) const;
  // The component tensors a source is stored as: required ones, and optional ones present in the checkpoint.
  std::vector<int> stored_components(const ParamSource& source) const;
  // All checkpoint keys of a parameter, sources in order.
  std::vector<std::string> checkpoint_keys(const ParamSpec& spec) const;
  std::set<std::string> all_checkpoint_keys() const;

  // Checks a stored tensor (dtype, shape; A_log's zero padding) against component `component` of source
  // `source` and returns it in the canonical shape slices refer to: A_log as [num_heads] (its padding cut
  // off), conv weights as [D, 1, W], FP8 scales 2-D, packed FP4 as U8. `key` names it in errors.
  TensorView normalize(const ParamSpec& spec, size_t source, size_t component, const TensorView& stored,
                       std::string_view key) const;

 private:
  ModelConfig config_;
  CheckpointLayout layout_;
  std::vector<ParamSpec> params_;
};

// KDA's A_log is stored padded to head_dim on Kimi K3 (and [1, 1, H, 1] by transformers): any vector-like
// shape with at least `num_heads` values, everything past the first `num_heads` exactly zero. Throws naming
// `key` otherwise.
void check_a_log_padding(const TensorView& stored, int64_t num_heads, std::string_view key);

}  // namespace kimirt::model
