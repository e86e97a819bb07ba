// `kimirt inspect --device`: the GPU (CUDA builds), the memory plan of its arena, and what the model needs
// per GPU: its weights (this rank's slice of every parameter in its storage format) and its caches (MLA
// latent rows per token, KDA recurrent state per sequence), with how many cached tokens the plan leaves
// room for.
#include "kimirt/cli/device_summary.h"

#include <fmt/format.h>

#include <algorithm>

#include "kimirt/base/error.h"
#include "kimirt/base/progress.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/schema.h"
#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/dtype.h"

#ifdef KIMIRT_HAVE_CUDA
#include "kimirt/cuda/device.h"
#include "kimirt/cuda/memory.h"
#endif

namespace kimirt::cli {
namespace {

#ifdef KIMIRT_HAVE_CUDA
cuda::MemoryBudget budget_of(const std::string& gpu_memory) {
  return gpu_memory.empty() ? cuda::MemoryBudget{} : cuda::parse_memory_budget(gpu_memory);
}
#endif

constexpr int64_t kDefaultContext = 131072;  // the default cache: one sequence this long (or the model's
                                             // max context when that is shorter)

// Bytes of `elements` values of a component as stored: the first dtype of this list the format accepts
// (so float weights count as BF16; the few fp32 vectors of a checkpoint do not change the total).
uint64_t component_bytes(quant::WeightFormat format, const quant::Component& c, uint64_t elements) {
  for (DType t : {DType::kBF16, DType::kF8E4M3, DType::kU8, DType::kF8E8M0, DType::kF32}) {
    if (quant::component_accepts(format, c, t)) return dtype_bytes(t, elements).value_or(0);
  }
  return 2 * elements;
}

struct ModelNeeds {
  int tp = 1;
  uint64_t weight_bytes = 0;
  uint64_t mla_bytes_per_token = 0;  // latent rows of every MLA layer
  uint64_t kda_bytes_per_sequence = 0;
  int64_t default_context = kDefaultContext;
  std::string error;  // the mapping does not fit the model
};

ModelNeeds model_needs(const model::ModelConfig& config, int tp) {
  ModelNeeds n;
  n.tp = tp;
  n.default_context = std::min(config.max_position_embeddings.value_or(kDefaultContext), kDefaultContext);
  try {
    const model::Schema schema(config, model::default_layout(config));
    const model::ParallelMapping mapping = model::ParallelMapping::make(tp, 0);
    for (const model::ParamSlice& s : model::slice_all(schema, mapping)) {
      if (!s.held()) continue;
      const quant::WeightFormat format = s.spec->sources.front().format;
      for (const quant::Component& c : quant::format_components(format)) {
        if (!c.required) continue;
        const Shape shape = quant::component_shape(format, c, s.local_shape);
        uint64_t elements = 1;
        for (int64_t d : shape) elements *= static_cast<uint64_t>(d);
        n.weight_bytes += component_bytes(format, c, elements);
      }
    }
  } catch (const Error& e) {
    n.error = e.what();
  }
  int64_t mla_layers = 0, kda_layers = 0;
  for (int64_t l = 0; l < config.num_layers; ++l) (config.is_kda_layer(l) ? kda_layers : mla_layers) += 1;
  // BF16 latent rows [kv_lora_rank | rope] (shared by all heads, so every TP rank keeps them whole).
  n.mla_bytes_per_token = static_cast<uint64_t>(mla_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 2);
  // fp32 state [heads, head_dim, head_dim] and BF16 short-conv tails of q, k, v for this rank's heads.
  const int64_t heads = std::max<int64_t>(1, config.kda_num_heads / tp);
  n.kda_bytes_per_sequence = static_cast<uint64_t>(
      kda_layers * (heads * config.kda_head_dim * config.kda_head_dim * 4 +
                    3 * heads * config.kda_head_dim * std::max<int64_t>(0, config.kda_conv_kernel - 1) * 2));
  return n;
}

std::string needs_text(const ModelNeeds& n) {
  std::string out;
  if (!n.error.empty()) return fmt::format("  model/GPU   tp {}: {}\n", n.tp, n.error);
  out += fmt::format("  model/GPU   tp {}: weights {} (stored formats; float weights as BF16)\n", n.tp,
                     format_bytes(n.weight_bytes));
  out += fmt::format(
      "  cache       MLA latent {} per token, KDA state {} per sequence; default cache ({} tokens, "
      "1 sequence) {}\n",
      format_bytes(n.mla_bytes_per_token), format_bytes(n.kda_bytes_per_sequence), n.default_context,
      format_bytes(n.mla_bytes_per_token * static_cast<uint64_t>(n.default_context) + n.kda_bytes_per_sequence));
  return out;
}

nlohmann::json needs_json(const ModelNeeds& n) {
  nlohmann::json j{{"tp", n.tp}};
  if (!n.error.empty()) {
    j["error"] = n.error;
    return j;
  }
  j["weight_bytes"] = n.weight_bytes;
  j["mla_cache_bytes_per_token"] = n.mla_bytes_per_token;
  j["kda_state_bytes_per_sequence"] = n.kda_bytes_per_sequence;
  j["default_cache_tokens"] = n.default_context;
  j["default_cache_bytes"] =
      n.mla_bytes_per_token * static_cast<uint64_t>(n.default_context) + n.kda_bytes_per_sequence;
  return j;
}

#ifdef KIMIRT_HAVE_CUDA
// Two spaces before every line, as the rest of the inspect output.
std::string indent(const std::string& text) {
  std::string out;
  bool line_start = true;
  for (char c : text) {
    if (line_start) out += "  ";
    out += c;
    line_start = c == '\n';
  }
  return out;
}

// What is left of the plan's persistent region for caches once the weights are in, and the tokens that buys
// (one sequence's KDA state set aside).
struct Fit {
  bool fits = false;
  uint64_t cache_bytes = 0;
  uint64_t tokens = 0;
};

Fit fit(const cuda::MemoryPlan& plan, const ModelNeeds& n) {
  Fit f;
  const uint64_t room = plan.persistent_bytes - plan.workspace_bytes;
  f.fits = n.error.empty() && n.weight_bytes + n.kda_bytes_per_sequence <= room;
  if (!f.fits) return f;
  f.cache_bytes = room - n.weight_bytes;
  f.tokens = n.mla_bytes_per_token ? (f.cache_bytes - n.kda_bytes_per_sequence) / n.mla_bytes_per_token : 0;
  return f;
}
#endif

}  // namespace

void check_gpu_memory(const std::string& gpu_memory) {
#ifdef KIMIRT_HAVE_CUDA
  if (!gpu_memory.empty()) cuda::parse_memory_budget(gpu_memory);
#else
  KIMIRT_CHECK(gpu_memory.empty(), "--gpu-memory {}: this kimirt was built without CUDA", gpu_memory);
#endif
}

std::string device_summary_text(const std::optional<model::ModelConfig>& config, const std::string& gpu_memory) {
  check_gpu_memory(gpu_memory);
  std::string out;
#ifdef KIMIRT_HAVE_CUDA
  if (!cuda::gpu_available()) {
    out += "  device      none visible (CUDA build, but no driver or device)\n";
    if (config) out += needs_text(model_needs(*config, 1));
    return out;
  }
  try {
    const cuda::DeviceInfo info = cuda::query_device(0);
    const int gpus = cuda::device_count();
    const cuda::MemoryPlan plan = cuda::plan_memory(info, budget_of(gpu_memory));
    out += indent(cuda::describe(info) + "\n");
    if (gpus > 1) out += fmt::format("  ({} GPUs visible; the plan below is per GPU)\n", gpus);
    out += indent(cuda::memory_plan_text(plan));
    if (config) {
      const ModelNeeds n = model_needs(*config, gpus);
      out += needs_text(n);
      const Fit f = fit(plan, n);
      if (f.fits) {
        out += fmt::format("  fit         after the weights {} remain for caches: {} cached tokens\n",
                           format_bytes(f.cache_bytes), f.tokens);
      } else if (n.error.empty()) {
        out += fmt::format("  fit         the weights ({}) do not fit this plan's {} for weights and caches\n",
                           format_bytes(n.weight_bytes), format_bytes(plan.persistent_bytes - plan.workspace_bytes));
      }
    }
  } catch (const Error& e) {
    if (!gpu_memory.empty()) throw;  // the budget asked for does not plan: an error, not a note
    out += fmt::format("  device      error: {}\n", e.what());
  }
#else
  out += "  device      none: this kimirt was built without CUDA\n";
  if (config) out += needs_text(model_needs(*config, 1));
#endif
  return out;
}

nlohmann::json device_summary_json(const std::optional<model::ModelConfig>& config, const std::string& gpu_memory) {
  check_gpu_memory(gpu_memory);
  nlohmann::json j;
#ifdef KIMIRT_HAVE_CUDA
  j["cuda"] = true;
  const int gpus = cuda::gpu_available() ? cuda::device_count() : 0;
  j["gpus"] = gpus;
  try {
    if (gpus > 0) {
      const cuda::DeviceInfo info = cuda::query_device(0);
      const cuda::MemoryPlan plan = cuda::plan_memory(info, budget_of(gpu_memory));
      j["device"] = {{"name", info.name},
                     {"compute_capability", fmt::format("{}.{}", info.cc_major, info.cc_minor)},
                     {"sm_count", info.sm_count},
                     {"total_memory", info.total_memory},
                     {"free_memory", info.free_memory},
                     {"l2_cache_bytes", info.l2_cache_bytes}};
      j["memory_plan"] = {{"arena_bytes", plan.arena_bytes},
                          {"persistent_bytes", plan.persistent_bytes},
                          {"workspace_bytes", plan.workspace_bytes},
                          {"step_bytes", plan.step_bytes}};
      if (config) {
        const ModelNeeds n = model_needs(*config, gpus);
        j["model_per_gpu"] = needs_json(n);
        const Fit f = fit(plan, n);
        j["model_per_gpu"]["fits"] = f.fits;
        if (f.fits) j["model_per_gpu"]["cache_tokens"] = f.tokens;
      }
    } else if (config) {
      j["model_per_gpu"] = needs_json(model_needs(*config, 1));
    }
  } catch (const Error& e) {
    if (!gpu_memory.empty()) throw;
    j["error"] = e.what();
  }
#else
  j["cuda"] = false;
  if (config) j["model_per_gpu"] = needs_json(model_needs(*config, 1));
#endif
  return j;
}

}  // namespace kimirt::cli
