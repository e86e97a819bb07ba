#include "kimirt/runtime/cpu_weights.h"

#include <atomic>
#include <exception>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/model/schema.h"

namespace kimirt::runtime {
namespace {

using model::ParamRole;

cpu::GluActivation activation(const model::ModelConfig& c) {
  if (c.hidden_act == model::HiddenAct::kSilu) return cpu::GluActivation::silu();
  std::optional<float> linear;
  if (c.situ_linear_beta) linear = static_cast<float>(*c.situ_linear_beta);
  return cpu::GluActivation::situ(static_cast<float>(c.situ_beta.value_or(1.0)), linear);
}

cpu::RouterConfig router_config(const model::ModelConfig& c) {
  cpu::RouterConfig r;
  r.num_experts = c.num_experts;
  r.top_k = c.num_experts_per_token;
  r.num_expert_group = c.use_grouped_topk ? c.num_expert_group : 1;
  r.topk_group = c.use_grouped_topk ? c.topk_group : 1;
  r.renormalize = c.moe_renormalize;
  r.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  return r;
}

// Every parameter dequantized to f32, on the global pool: parameters are handed out one at a time (their
// sizes differ by orders of magnitude, so fixed ranges would leave threads idle), and a failure is reported
// for the first failing parameter in store order whatever the timing. Single-threaded this took 3.6-11 s
// for a 1 B-parameter model.
std::vector<Tensor> to_f32_parallel(const std::vector<const model::LoadedParam*>& todo) {
  std::vector<Tensor> out(todo.size());
  std::vector<std::exception_ptr> errors(todo.size());
  std::atomic<size_t> next{0};
  ThreadPool& pool = ThreadPool::global();
  pool.parallel_for(static_cast<int64_t>(pool.num_threads()), 1, [&](int64_t, int64_t) {
    for (size_t i = next.fetch_add(1); i < todo.size(); i = next.fetch_add(1)) {
      try {
        out[i] = with_context(todo[i]->spec->name, [&] { return todo[i]->to_f32(); });
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  });
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

}  // namespace

CpuWeights::CpuWeights(const model::ModelConfig& c, const model::ParamStore& params,
                       const model::ParallelMapping& mapping) {
  mapping.validate(c);
  const int64_t H = c.hidden_size;
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.is_moe_layer(l))
      layers_[static_cast<size_t>(l)].experts.resize(static_cast<size_t>(c.num_experts / mapping.ep_size));
  }

  // Head counts and widths are set to this rank's share below, from the slices the mapping gives it.
  dims_.kda.hidden = H;
  dims_.kda.num_heads = c.kda_num_heads;
  dims_.kda.head_dim = c.kda_head_dim;
  dims_.kda.conv_width = c.kda_conv_kernel;
  if (c.kda_gate_lower_bound) dims_.kda.gate_lower_bound = static_cast<float>(*c.kda_gate_lower_bound);
  dims_.kda.full_rank_output_gate = c.kda_use_full_rank_gate;
  dims_.kda.rms_norm_eps = static_cast<float>(c.rms_norm_eps);
  dims_.mla.hidden = H;
  dims_.mla.num_heads = c.mla_num_heads;
  dims_.mla.q_lora_rank = c.q_lora_rank.value_or(0);
  dims_.mla.kv_lora_rank = c.kv_lora_rank;
  dims_.mla.qk_nope_head_dim = c.qk_nope_head_dim;
  dims_.mla.qk_rope_head_dim = c.qk_rope_head_dim;
  dims_.mla.v_head_dim = c.v_head_dim;
  dims_.mla.output_gate = c.mla_use_output_gate;
  // Latent norms keep cpu::MlaDims' ε (1e-6, the references' choice), not rms_norm_eps.
  dims_.expert_width = c.expert_hidden_size();
  dims_.router = router_config(c);
  dims_.act = activation(c);
  dims_.rms_norm_eps = static_cast<float>(c.rms_norm_eps);

  // Every parameter this rank must hold is in the store (the list of names does not depend on how the
  // checkpoint stores them, so the config's schema can give it).
  const model::Schema names(c, model::default_layout(c));
  for (const model::ParamSpec& spec : names.params()) {
    if (model::slice_logical(c, spec, mapping).held()) (void)params.at(spec.name);
  }
  // What each holds comes from the store: its spec belongs to the schema the checkpoint was loaded with,
  // whose storage formats are the stored ones (a config's quantization_config need not match them).
  std::vector<const model::LoadedParam*> todo;
  std::vector<model::ParamSlice> slices;
  for (const auto& [name, p] : params.params()) {
    KIMIRT_CHECK(p.spec != nullptr, "parameter {}: the parameter store has no spec for it", name);
    model::ParamSlice slice = model::slice_logical(c, *p.spec, mapping);
    KIMIRT_CHECK(slice.held(), "parameter {}: in the parameter store, but {} holds {}", name, mapping.str(),
                 slice.describe());
    todo.push_back(&p);
    slices.push_back(std::move(slice));
  }
  std::vector<Tensor> converted = to_f32_parallel(todo);
  for (size_t index = 0; index < todo.size(); ++index) {
    const model::ParamSpec& spec = *todo[index]->spec;
    const model::ParamSlice& slice = slices[index];
    Tensor t = std::move(converted[index]);
    KIMIRT_CHECK(t.shape() == slice.local_shape,
                 "parameter {}: shape {} in the parameter store, expected {} ({} for {})", spec.name,
                 shape_str(t.shape()), shape_str(slice.local_shape), slice.describe(), mapping.str());
    const float* w = t.data_as<float>();
    storage_.push_back(std::move(t));
    const Shape& shape = slice.local_shape;
    CpuLayerWeights* L = spec.layer >= 0 ? &layers_[static_cast<size_t>(spec.layer)] : nullptr;
    switch (spec.role) {
      case ParamRole::kEmbed:
        embed_ = w;
        break;
      case ParamRole::kFinalNorm:
        final_norm_ = w;
        break;
      case ParamRole::kLmHead:
        lm_head_ = w;
        dims_.vocab_rows = shape[0];
        break;
      case ParamRole::kOutputResNorm:
        output_res_.norm = w;
        break;
      case ParamRole::kOutputResProj:
        output_res_.proj = w;
        break;
      case ParamRole::kInputNorm:
        L->input_norm = w;
        break;
      case ParamRole::kPostAttnNorm:
        L->post_attention_norm = w;
        break;
      case ParamRole::kAttnResNorm:
        L->mixer_res.norm = w;
        break;
      case ParamRole::kAttnResProj:
        L->mixer_res.proj = w;
        break;
      case ParamRole::kMlpResNorm:
        L->ffn_res.norm = w;
        break;
      case ParamRole::kMlpResProj:
        L->ffn_res.proj = w;
        break;
      case ParamRole::kKdaQ:
        L->kda.q_proj = w;
        break;
      case ParamRole::kKdaK:
        L->kda.k_proj = w;
        break;
      case ParamRole::kKdaV:
        L->kda.v_proj = w;
        break;
      case ParamRole::kKdaG:
        L->kda.g_proj = w;
        break;
      case ParamRole::kKdaGA:
        L->kda.g_a_proj = w;
        break;
      case ParamRole::kKdaGB:
        L->kda.g_b_proj = w;
        break;
      case ParamRole::kKdaFA:
        L->kda.f_a_proj = w;
        break;
      case ParamRole::kKdaFB:
        L->kda.f_b_proj = w;
        break;
      case ParamRole::kKdaB:
        L->kda.b_proj = w;
        break;
      case ParamRole::kKdaQConv:
        L->kda.q_conv = w;
        break;  // [D, 1, W]: the bytes of [D, W]
      case ParamRole::kKdaKConv:
        L->kda.k_conv = w;
        break;
      case ParamRole::kKdaVConv:
        L->kda.v_conv = w;
        break;
      case ParamRole::kKdaALog:
        L->kda.a_log = w;
        dims_.kda.num_heads = shape[0];
        break;
      case ParamRole::kKdaDtBias:
        L->kda.dt_bias = w;
        break;
      case ParamRole::kKdaONorm:
        L->kda.o_norm = w;
        break;
      case ParamRole::kKdaO:
        L->kda.o_proj = w;
        break;
      case ParamRole::kMlaQ:
        L->mla.q_proj = w;
        break;
      case ParamRole::kMlaQA:
        L->mla.q_a_proj = w;
        break;
      case ParamRole::kMlaQANorm:
        L->mla.q_a_norm = w;
        break;
      case ParamRole::kMlaQB:
        L->mla.q_b_proj = w;
        break;
      case ParamRole::kMlaKvA:
        L->mla.kv_a_proj = w;
        break;
      case ParamRole::kMlaKvANorm:
        L->mla.kv_a_norm = w;
        break;
      case ParamRole::kMlaKvB:
        L->mla.kv_b_proj = w;
        break;
      case ParamRole::kMlaG:
        L->mla.g_proj = w;
        break;
      case ParamRole::kMlaO:
        L->mla.o_proj = w;
        dims_.mla.num_heads = shape[1] / c.v_head_dim;
        break;
      case ParamRole::kDenseGateUp:
        // [gate | up]: gate rows first, each half this rank's share.
        L->dense.gate_proj = w;
        L->dense.up_proj = w + (shape[0] / 2) * H;
        break;
      case ParamRole::kDenseDown:
        L->dense.down_proj = w;
        dims_.dense_intermediate = shape[1];
        dims_.dense_tp = static_cast<int>(c.intermediate_size / shape[1]);
        break;
      case ParamRole::kRouter:
        L->router.gate = w;
        break;
      case ParamRole::kRouterBias:
        L->router.correction_bias = w;
        break;
      case ParamRole::kSharedGateUp:
        L->shared.gate_proj = w;
        L->shared.up_proj = w + (shape[0] / 2) * H;
        break;
      case ParamRole::kSharedDown:
        L->shared.down_proj = w;
        dims_.shared_intermediate = shape[1];
        break;
      case ParamRole::kLatentDown:
        L->latent_down = w;
        break;
      case ParamRole::kLatentNorm:
        L->latent_norm = w;
        break;
      case ParamRole::kLatentUp:
        L->latent_up = w;
        break;
      case ParamRole::kExpertW1:
      case ParamRole::kExpertW2:
      case ParamRole::kExpertW3: {
        auto& e = L->experts.at(static_cast<size_t>(slice.local_expert));
        L->first_expert = spec.expert - slice.local_expert;
        if (spec.role == ParamRole::kExpertW1) {
          e.gate_proj = w;
          dims_.expert_intermediate = shape[0];
        } else if (spec.role == ParamRole::kExpertW3) {
          e.up_proj = w;
        } else {
          e.down_proj = w;
        }
        break;
      }
    }
  }
}

uint64_t CpuWeights::bytes() const {
  uint64_t total = 0;
  for (const auto& t : storage_) total += t.nbytes();
  return total;
}

}  // namespace kimirt::runtime
