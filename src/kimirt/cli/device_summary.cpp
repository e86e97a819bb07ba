// `kimirt inspect --device`: the GPU (CUDA builds), the memory plan of its arena, and what the model needs
// per GPU: its weights (this rank's slice of every parameter in its storage format) and its caches (MLA
// latent rows per token, KDA recurrent state per sequence), with how many cached tokens the plan leaves
// room for.
#include "kimirt/cli/device_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

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

// stored: the checkpoint's schema (its formats resolved from the tensors), or null to predict them from config.
ModelNeeds model_needs(const model::ModelConfig& config, const model::Schema* stored, int tp) {
  ModelNeeds n;
  n.tp = tp;
  n.default_context = std::min(config.max_position_embeddings.value_or(kDefaultContext), kDefaultContext);
  try {
    const std::optional<model::Schema> predicted =
        stored ? std::nullopt : std::optional<model::Schema>(std::in_place, config, model::default_layout(config));
    const model::Schema& schema = stored ? *stored : *predicted;
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

struct GpuPlan {
  cuda::DeviceInfo info;
  cuda::MemoryPlan plan;
  Fit fit;
};

// Every visible GPU planned under one budget, since each has its own free memory (another process on one
// GPU is the usual way a multi-GPU start runs out of memory), and what the model leaves for caches on each.
// The tensor-parallel ranks each keep the whole MLA latent cache, so the cache the model gets is the
// smallest GPU's.
struct DeviceReport {
  int gpus = 0;
  std::vector<GpuPlan> plans;  // one per GPU, unless `error`
  std::optional<ModelNeeds> needs;
  std::string error;  // a GPU the default budget could not plan (an explicit budget throws instead)

  bool all_fit() const {
    return !plans.empty() && std::all_of(plans.begin(), plans.end(), [](const GpuPlan& g) { return g.fit.fits; });
  }
  const GpuPlan& tightest() const {
    return *std::min_element(plans.begin(), plans.end(),
                             [](const GpuPlan& a, const GpuPlan& b) { return a.fit.cache_bytes < b.fit.cache_bytes; });
  }
};

DeviceReport device_report(const std::optional<model::ModelConfig>& config, const model::Schema* stored,
                           const std::string& gpu_memory) {
  DeviceReport r;
  const cuda::MemoryBudget budget = gpu_memory.empty() ? cuda::MemoryBudget{} : cuda::parse_memory_budget(gpu_memory);
  r.gpus = cuda::gpu_available() ? cuda::device_count() : 0;
  if (config) r.needs = model_needs(*config, stored, std::max(r.gpus, 1));
  for (int d = 0; d < r.gpus; ++d) {
    try {
      GpuPlan g;
      g.info = cuda::query_device(d);
      g.plan = cuda::plan_memory(g.info, budget);
      if (r.needs) g.fit = fit(g.plan, *r.needs);
      r.plans.push_back(std::move(g));
    } catch (const Error& e) {
      if (!gpu_memory.empty()) throw Error(fmt::format("GPU {}: {}", d, e.what()));
      r.error = fmt::format("GPU {}: {}", d, e.what());
      r.plans.clear();
      break;
    }
  }
  return r;
}

std::string fit_text(const GpuPlan& g, const ModelNeeds& n, const std::string& who) {
  if (g.fit.fits) {
    return fmt::format("  fit         {}after the weights {} remain for caches: {} cached tokens\n", who,
                       format_bytes(g.fit.cache_bytes), g.fit.tokens);
  }
  if (!n.error.empty()) return {};
  return fmt::format("  fit         {}the weights ({}) do not fit this plan's {} for weights and caches\n", who,
                     format_bytes(n.weight_bytes), format_bytes(g.plan.persistent_bytes - g.plan.workspace_bytes));
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

std::string device_summary_text(const std::optional<model::ModelConfig>& config, const model::Schema* stored,
                                const std::string& gpu_memory) {
  std::string out;
#ifdef KIMIRT_HAVE_CUDA
  const DeviceReport r = device_report(config, stored, gpu_memory);
  if (r.gpus == 0) out += "  device      none visible (CUDA build, but no driver or device)\n";
  if (!r.error.empty()) out += fmt::format("  device      error: {}\n", r.error);
  for (const GpuPlan& g : r.plans) out += indent(cuda::describe(g.info) + "\n" + cuda::memory_plan_text(g.plan));
  if (r.needs) {
    out += needs_text(*r.needs);
    for (const GpuPlan& g : r.plans) {
      out += fit_text(g, *r.needs, r.gpus > 1 ? fmt::format("GPU {}: ", g.info.ordinal) : std::string());
    }
    if (r.plans.size() > 1 && r.all_fit()) {
      const GpuPlan& t = r.tightest();
      out += fmt::format(
          "  fit         all {} GPUs: {} cached tokens (GPU {} has the least room; every rank keeps "
          "the whole latent cache)\n",
          r.gpus, t.fit.tokens, t.info.ordinal);
    }
  }
#else
  check_gpu_memory(gpu_memory);
  out += "  device      none: this kimirt was built without CUDA\n";
  if (config) out += needs_text(model_needs(*config, stored, 1));
#endif
  return out;
}

nlohmann::json device_summary_json(const std::optional<model::ModelConfig>& config, const model::Schema* stored,
                                   const std::string& gpu_memory) {
  nlohmann::json j;
#ifdef KIMIRT_HAVE_CUDA
  const DeviceReport r = device_report(config, stored, gpu_memory);
  j["cuda"] = true;
  j["gpus"] = r.gpus;
  if (!r.error.empty()) j["error"] = r.error;
  j["devices"] = nlohmann::json::array();
  for (const GpuPlan& g : r.plans) {
    nlohmann::json d = {{"ordinal", g.info.ordinal},
                        {"name", g.info.name},
                        {"compute_capability", fmt::format("{}.{}", g.info.cc_major, g.info.cc_minor)},
                        {"sm_count", g.info.sm_count},
                        {"total_memory", g.info.total_memory},
                        {"free_memory", g.info.free_memory},
                        {"l2_cache_bytes", g.info.l2_cache_bytes},
                        {"memory_plan",
                         {{"arena_bytes", g.plan.arena_bytes},
                          {"persistent_bytes", g.plan.persistent_bytes},
                          {"workspace_bytes", g.plan.workspace_bytes},
                          {"step_bytes", g.plan.step_bytes}}}};
    if (r.needs) {
      d["fits"] = g.fit.fits;
      if (g.fit.fits) d["cache_tokens"] = g.fit.tokens;
    }
    j["devices"].push_back(std::move(d));
  }
  if (r.needs) {
    j["model_per_gpu"] = needs_json(*r.needs);
    if (!r.plans.empty()) {
      j["model_per_gpu"]["fits"] = r.all_fit();
      if (r.all_fit()) j["model_per_gpu"]["cache_tokens"] = r.tightest().fit.tokens;
    }
  }
#else
  check_gpu_memory(gpu_memory);
  j["cuda"] = false;
  if (config) j["model_per_gpu"] = needs_json(model_needs(*config, stored, 1));
#endif
  return j;
}

}  // namespace kimirt::cli
