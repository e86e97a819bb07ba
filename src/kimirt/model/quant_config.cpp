#include "kimirt/model/quant_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kimirt/base/error.h"
#include "kimirt/model/json_fields.h"

namespace kimirt::model {
namespace {

using json = nlohmann::json;

constexpr int64_t kFp8Block = 128;

const char* method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kMxfp4:
      return "MXFP4";
    case QuantMethod::kFp8Block:
      return "FP8 block";
    case QuantMethod::kNvfp4:
      return "NVFP4";
  }
  return "?";
}

// The compressed-tensors "format" string of each method.
const char* ct_format(QuantMethod m) {
  switch (m) {
    case QuantMethod::kMxfp4:
      return "mxfp4-pack-quantized";
    case QuantMethod::kNvfp4:
      return "nvfp4-pack-quantized";
    case QuantMethod::kFp8Block:
      return "float-quantized";
    case QuantMethod::kNone:
      break;
  }
  return "";
}

// One compressed-tensors config group -> the method it declares.
QuantMethod parse_ct_group(const JsonFields& group, const std::optional<std::string>& top_format) {
  const JsonFields w = group.object("weights");
  const int64_t bits = w.get_int("num_bits");
  const std::string type = w.get_string("type");
  const std::string strategy = w.get_string("strategy");
  if (!w.bool_or("symmetric", true))
    w.fail_field("symmetric", "is false: asymmetric (zero-point) weights are not implemented");
  if (w.bool_or("dynamic", false)) w.fail_field("dynamic", "is true: weights must be stored quantized (static)");
  QuantMethod method = QuantMethod::kNone;
  if (bits == 4 && type == "float" && strategy == "group") {
    const int64_t g = w.get_int("group_size");
    if (g != 32) w.fail_field("group_size", fmt::format("is {}: MXFP4 groups are 32 elements", g));
    if (auto sd = w.opt_string("scale_dtype"); sd && *sd != "torch.uint8" && *sd != "torch.float8_e8m0fnu") {
      w.fail_field("scale_dtype", fmt::format("is \"{}\": MXFP4 scales are E8M0 stored as uint8", *sd));
    }
    method = QuantMethod::kMxfp4;
  } else if (bits == 4 && type == "float" && strategy == "tensor_group") {
    const int64_t g = w.get_int("group_size");
    if (g != 16) w.fail_field("group_size", fmt::format("is {}: NVFP4 groups are 16 elements", g));
    method = QuantMethod::kNvfp4;
  } else if (bits == 8 && type == "float" && strategy == "block") {
    const auto block = w.get_int_list("block_structure");
    if (block != std::vector<int64_t>{kFp8Block, kFp8Block}) {
      w.fail_field("block_structure",
                   fmt::format("is [{}]: only 128x128 FP8 blocks are implemented", fmt::join(block, ", ")));
    }
    method = QuantMethod::kFp8Block;
  } else {
    fail(
        "{}: {}: num_bits {}, type \"{}\", strategy \"{}\" is not a weight format kimirt implements (MXFP4 group 32, "
        "NVFP4 tensor_group 16, FP8 block 128x128)",
        w.source(), w.where(), bits, type, strategy);
  }
  const auto format = group.opt_string("format") ? group.opt_string("format") : top_format;
  if (format && *format != ct_format(method)) {
    fail("{}: {} \"{}\" does not match its weights ({} is \"{}\")", group.source(),
         group.has("format") ? group.field("format") : std::string("format"), *format, method_name(method),
         ct_format(method));
  }
  return method;
}

QuantizationConfig parse_compressed_tensors(const JsonFields& q) {
  QuantizationConfig out;
  out.provider = QuantProvider::kCompressedTensors;
  if (auto status = q.opt_string("quantization_status"); status && *status != "compressed") {
    q.fail_field("quantization_status",
                 fmt::format("is \"{}\": only \"compressed\" checkpoints store quantized weights", *status));
  }
  const auto top_format = q.opt_string("format");
  const JsonFields groups = q.object("config_groups");
  if (groups.json().empty()) q.fail_field("config_groups", "is empty");
  for (const auto& [name, value] : groups.json().items()) {
    const JsonFields group = groups.object(name);
    const QuantMethod m = parse_ct_group(group, top_format);
    if (out.method != QuantMethod::kNone && m != out.method) {
      groups.fail_field(name, fmt::format("declares {} but another group declares {}: one weight format per checkpoint",
                                          method_name(m), method_name(out.method)));
    }
    out.method = m;
    for (auto& t : group.string_list_or_empty("targets")) out.targets.push_back(std::move(t));
  }
  out.ignore = q.string_list_or_empty("ignore");
  if (out.method == QuantMethod::kMxfp4) out.group_size = 32;
  if (out.method == QuantMethod::kNvfp4) out.group_size = 16;
  if (out.method == QuantMethod::kFp8Block) out.block_rows = out.block_cols = kFp8Block;
  return out;
}

QuantizationConfig parse_deepseek_fp8(const JsonFields& q) {
  if (auto f = q.opt_string("fmt"); f && *f != "e4m3") {
    q.fail_field("fmt", fmt::format("is \"{}\": only e4m3 FP8 weights are implemented", *f));
  }
  const auto block = q.get_int_list("weight_block_size");
  if (block != std::vector<int64_t>{kFp8Block, kFp8Block}) {
    q.fail_field("weight_block_size", fmt::format("is [{}]: only [128, 128] is implemented", fmt::join(block, ", ")));
  }
  QuantizationConfig out = QuantizationConfig::fp8_block(QuantProvider::kDeepSeekFp8);
  out.ignore = q.string_list_or_empty("modules_to_not_convert");
  return out;
}

QuantMethod parse_modelopt_algo(const JsonFields& f, std::string_view key) {
  const std::string algo = f.get_string(key);
  if (algo == "NVFP4") {
    const int64_t g = f.int_or("group_size", 16);
    if (g != 16) f.fail_field("group_size", fmt::format("is {}: NVFP4 groups are 16 elements", g));
    return QuantMethod::kNvfp4;
  }
  if (algo == "FP8_PB_WO") return QuantMethod::kFp8Block;
  f.fail_field(key,
               fmt::format("is \"{}\": kimirt implements NVFP4 and FP8_PB_WO (and MIXED_PRECISION of them)", algo));
}

QuantizationConfig parse_modelopt(const JsonFields& q) {
  QuantizationConfig out;
  out.provider = QuantProvider::kModelOpt;
  out.ignore = q.string_list_or_empty("exclude_modules");
  if (q.get_string("quant_algo") == "MIXED_PRECISION") {
    out.modelopt_mixed = true;
    const JsonFields layers = q.object("quantized_layers");
    bool any_nvfp4 = false, any_fp8 = false;
    for (const auto& [name, value] : layers.json().items()) {
      const QuantMethod m = parse_modelopt_algo(layers.object(name), "quant_algo");
      any_nvfp4 |= m == QuantMethod::kNvfp4;
      any_fp8 |= m == QuantMethod::kFp8Block;
    }
    if (!any_nvfp4 && !any_fp8) q.fail_field("quantized_layers", "declares no quantized layer");
    out.method = any_nvfp4 ? QuantMethod::kNvfp4 : QuantMethod::kFp8Block;
  } else {
    out.method = parse_modelopt_algo(q, "quant_algo");
  }
  if (out.method == QuantMethod::kNvfp4) out.group_size = 16;
  if (out.method == QuantMethod::kFp8Block) out.block_rows = out.block_cols = kFp8Block;
  return out;
}

}  // namespace

quant::WeightFormat QuantizationConfig::expert_format() const {
  switch (method) {
    case QuantMethod::kNone:
      return quant::WeightFormat::kFloat;
    case QuantMethod::kMxfp4:
      return quant::WeightFormat::kMxfp4;
    case QuantMethod::kFp8Block:
      return provider == QuantProvider::kDeepSeekFp8 ? quant::WeightFormat::kFp8BlockScaleInv
                                                     : quant::WeightFormat::kFp8BlockScale;
    case QuantMethod::kNvfp4:
      return provider == QuantProvider::kModelOpt ? quant::WeightFormat::kNvfp4ModelOpt
                                                  : quant::WeightFormat::kNvfp4CompressedTensors;
  }
  return quant::WeightFormat::kFloat;
}

QuantizationConfig QuantizationConfig::kimi_k3_mxfp4() {
  QuantizationConfig q;
  q.method = QuantMethod::kMxfp4;
  q.provider = QuantProvider::kCompressedTensors;
  q.group_size = 32;
  q.targets = {"Linear"};
  q.ignore = {"re:.*self_attn.*", "re:.*shared_experts.*", R"(re:.*mlp\.(gate|up|gate_up|down)_proj.*)",
              "re:.*lm_head.*",   "re:.*vision_tower.*",   "re:.*mm_projector.*"};
  return q;
}

QuantizationConfig QuantizationConfig::fp8_block(QuantProvider provider) {
  QuantizationConfig q;
  q.method = QuantMethod::kFp8Block;
  q.provider = provider;
  q.block_rows = q.block_cols = kFp8Block;
  if (provider == QuantProvider::kCompressedTensors) q.targets = {"Linear"};
  return q;
}

QuantizationConfig QuantizationConfig::nvfp4(QuantProvider provider) {
  QuantizationConfig q;
  q.method = QuantMethod::kNvfp4;
  q.provider = provider;
  q.group_size = 16;
  if (provider == QuantProvider::kCompressedTensors) q.targets = {"Linear"};
  return q;
}

QuantizationConfig parse_quantization_config(const nlohmann::json& j, const std::string& source,
                                             const std::string& path) {
  const JsonFields q(j, source, path + ".");
  const std::string method = q.get_string("quant_method");
  if (method == "compressed-tensors") return parse_compressed_tensors(q);
  if (method == "fp8") return parse_deepseek_fp8(q);
  if (method == "modelopt") return parse_modelopt(q);
  q.fail_field("quant_method",
               fmt::format("is \"{}\": kimirt reads compressed-tensors, fp8 (DeepSeek) and modelopt", method));
}

nlohmann::json quantization_config_to_json(const QuantizationConfig& q,
                                           const std::vector<std::string>& expert_modules) {
  switch (q.provider) {
    case QuantProvider::kNone:
      return nullptr;
    case QuantProvider::kDeepSeekFp8: {
      json out = {{"quant_method", "fp8"},
                  {"fmt", "e4m3"},
                  {"activation_scheme", "dynamic"},
                  {"weight_block_size", {q.block_rows, q.block_cols}}};
      if (!q.ignore.empty()) out["modules_to_not_convert"] = q.ignore;
      return out;
    }
    case QuantProvider::kModelOpt: {
      const char* algo = q.method == QuantMethod::kNvfp4 ? "NVFP4" : "FP8_PB_WO";
      json out = {{"quant_method", "modelopt"}, {"exclude_modules", q.ignore}};
      if (q.modelopt_mixed) {
        out["quant_algo"] = "MIXED_PRECISION";
        json layers = json::object();
        for (const auto& m : expert_modules) {
          layers[m] = {{"quant_algo", algo}};
          if (q.method == QuantMethod::kNvfp4) layers[m]["group_size"] = q.group_size;
        }
        out["quantized_layers"] = std::move(layers);
      } else {
        out["quant_algo"] = algo;
        if (q.method == QuantMethod::kNvfp4) out["group_size"] = q.group_size;
      }
      return out;
    }
    case QuantProvider::kCompressedTensors:
      break;
  }
  json weights;
  switch (q.method) {
    case QuantMethod::kMxfp4:
      weights = {{"num_bits", 4},     {"type", "float"},  {"strategy", "group"},  {"group_size", q.group_size},
                 {"symmetric", true}, {"dynamic", false}, {"observer", "minmax"}, {"scale_dtype", "torch.uint8"}};
      break;
    case QuantMethod::kNvfp4:
      weights = {{"num_bits", 4},     {"type", "float"},  {"strategy", "tensor_group"}, {"group_size", q.group_size},
                 {"symmetric", true}, {"dynamic", false}, {"observer", "minmax"}};
      break;
    case QuantMethod::kFp8Block:
      weights = {{"num_bits", 8},       {"type", "float"},
                 {"strategy", "block"}, {"block_structure", {q.block_rows, q.block_cols}},
                 {"symmetric", true},   {"dynamic", false},
                 {"observer", "minmax"}};
      break;
    case QuantMethod::kNone:
      return nullptr;
  }
  return json{
      {"quant_method", "compressed-tensors"},
      {"format", ct_format(q.method)},
      {"quantization_status", "compressed"},
      {"config_groups", {{"group_0", {{"format", ct_format(q.method)}, {"targets", q.targets}, {"weights", weights}}}}},
      {"ignore", q.ignore}};
}

}  // namespace kimirt::model
