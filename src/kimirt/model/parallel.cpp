#include "kimirt/model/parallel.h"

#include <fmt/format.h>

#include "kimirt/base/error.h"

namespace kimirt::model {
namespace {

// The `index`-th of `parts` equal pieces of [0, n) (divisibility is checked by validate(config)).
std::pair<int64_t, int64_t> piece(int64_t n, int64_t parts, int64_t index) {
  const int64_t size = n / parts;
  return {index * size, (index + 1) * size};
}

// Region of `shape` with dimension `dim` restricted to [b, e).
quant::Region cut(const Shape& shape, int dim, int64_t b, int64_t e) {
  quant::Region r = quant::Region::full(shape);
  r.begin[static_cast<size_t>(dim)] = b;
  r.extent[static_cast<size_t>(dim)] = e - b;
  return r;
}

// Each source restricted to [b, e) on `dim`, stacked along dim 0 in source order. dim 1 is only used by
// single-source parameters (o_proj, down_proj, w2), so stacking along rows never meets a column cut.
quant::SliceRule stacked(const ParamSpec& spec, int dim, int64_t b, int64_t e) {
  quant::SliceRule rule;
  int64_t row = 0;
  for (size_t i = 0; i < spec.sources.size(); ++i) {
    const Shape& s = spec.sources[i].shape;
    const quant::Region src = cut(s, dim, b, e);
    quant::Region dst = src;
    dst.begin.assign(s.size(), 0);
    dst.begin[0] = row;
    rule.copies.push_back({static_cast<int>(i), src, dst});
    row += src.extent[0];
  }
  rule.dst_shape = spec.sources[0].shape;
  rule.dst_shape[static_cast<size_t>(dim)] = e - b;
  rule.dst_shape[0] = dim == 0 ? row : rule.dst_shape[0];
  return rule;
}

bool any_layer(const ModelConfig& c, LayerMixer kind) {
  for (auto m : c.layer_mixers) {
    if (m == kind) return true;
  }
  return false;
}

// What a role is cut along: rows or columns, in units of `unit` rows/columns per head (or per piece).
struct Cut {
  int dim = -1;       // -1: whole
  int64_t total = 0;  // pieces along dim (heads, vocabulary rows, intermediate rows)
  int64_t parts = 1;  // how many equal pieces
  int64_t index = 0;  // which piece
  int64_t unit = 1;   // rows/columns per piece element (head_dim for heads)
};

Cut choose_cut(const ModelConfig& c, const ParamSpec& spec, const ParallelMapping& m) {
  const int64_t T = m.tp_size, r = m.tp_rank;
  const bool attn_tp = !m.attention_dp && T > 1;
  const int64_t hd = c.kda_head_dim, kh = c.kda_num_heads, mh = c.mla_num_heads;
  auto kda_rows = [&](int64_t unit) { return attn_tp ? Cut{0, kh, T, r, unit} : Cut{}; };
  auto mla_rows = [&](int64_t unit) { return attn_tp ? Cut{0, mh, T, r, unit} : Cut{}; };
  auto mlp = [&](int dim, int64_t width) {
    if (m.attention_dp) return Cut{};
    const int64_t g = mlp_tp_size(m.tp_size, width);
    return Cut{dim, width, g, r % g, 1};
  };
  switch (spec.role) {
    case ParamRole::kKdaQ:
    case ParamRole::kKdaK:
    case ParamRole::kKdaV:
    case ParamRole::kKdaG:
    case ParamRole::kKdaGB:
    case ParamRole::kKdaFB:
    case ParamRole::kKdaQConv:
    case ParamRole::kKdaKConv:
    case ParamRole::kKdaVConv:
    case ParamRole::kKdaDtBias:
      return kda_rows(hd);
    case ParamRole::kKdaB:
    case ParamRole::kKdaALog:
      return kda_rows(1);
    case ParamRole::kKdaO:
      return attn_tp ? Cut{1, kh, T, r, hd} : Cut{};
    case ParamRole::kMlaQ:
    case ParamRole::kMlaQB:
      return mla_rows(c.qk_head_dim());
    case ParamRole::kMlaKvB:
      return mla_rows(c.qk_nope_head_dim + c.v_head_dim);
    case ParamRole::kMlaG:
      return mla_rows(c.v_head_dim);
    case ParamRole::kMlaO:
      return attn_tp ? Cut{1, mh, T, r, c.v_head_dim} : Cut{};
    case ParamRole::kLmHead:
      return Cut{0, c.vocab_size, T, r, 1};
    case ParamRole::kDenseGateUp:
      return mlp(0, c.intermediate_size);
    case ParamRole::kDenseDown:
      return mlp(1, c.intermediate_size);
    case ParamRole::kSharedGateUp:
      return mlp(0, c.shared_intermediate_size());
    case ParamRole::kSharedDown:
      return mlp(1, c.shared_intermediate_size());
    case ParamRole::kExpertW1:
    case ParamRole::kExpertW3:
      return Cut{0, c.moe_intermediate_size, m.moe_tp_size(), m.moe_tp_rank(), 1};
    case ParamRole::kExpertW2:
      return Cut{1, c.moe_intermediate_size, m.moe_tp_size(), m.moe_tp_rank(), 1};
    default:
      return Cut{};
  }
}

void add_component_slices(const Schema& schema, ParamSlice& out) {
  const ParamSpec& spec = *out.spec;
  const ParamSource& first = spec.sources[0];
  for (const auto& src : spec.sources) {
    KIMIRT_CHECK(src.format == first.format && src.optional_present == first.optional_present,
                 "{}: sources {} and {} are stored differently", spec.name, first.base, src.base);
  }
  const auto comps = quant::format_components(first.format);
  for (int ci : schema.stored_components(first)) {
    const auto& comp = comps[static_cast<size_t>(ci)];
    ComponentSlice cs;
    cs.component = ci;
    for (const auto& src : spec.sources) cs.keys.push_back(schema.key(spec, src, comp));
    if (comp.scalar()) {
      // A per-tensor scale cannot be shared by two halves that were scaled separately.
      KIMIRT_CHECK(spec.sources.size() == 1,
                   "{}: cannot fuse {} halves that each carry a per-tensor {} into one {}; load them dequantized",
                   cs.keys[0], quant::format_name(first.format), comp.suffix, spec.name);
      cs.rule = {Shape{}, {{0, quant::Region{}, quant::Region{}}}};
    } else {
      cs.rule.dst_shape = quant::component_shape(first.format, comp, out.local_shape);
      for (const auto& copy : out.logical.copies) {
        const auto& key = cs.keys[static_cast<size_t>(copy.source)];
        const auto& src = spec.sources[static_cast<size_t>(copy.source)];
        cs.rule.copies.push_back(
            {copy.source, quant::component_region(comp, src.shape, copy.src, key),
             quant::component_region(comp, out.local_shape, copy.dst,
                                     fmt::format("{} (as part of the local {})", key, spec.name))});
      }
    }
    out.components.push_back(std::move(cs));
  }
}

}  // namespace

ParallelMapping ParallelMapping::make(int tp_size, int tp_rank, int ep_size, bool attention_dp) {
  ParallelMapping m{tp_size, tp_rank, ep_size, ep_size > 0 ? tp_rank % ep_size : 0, attention_dp};
  m.validate();
  return m;
}

std::string ParallelMapping::str() const {
  return fmt::format("tp {}/{}, ep {}/{}, moe_tp {}, attention-DP {}", tp_rank, tp_size, ep_rank, ep_size,
                     ep_size > 0 ? tp_size / ep_size : 0, attention_dp ? "on" : "off");
}

void ParallelMapping::validate() const {
  const std::string w = "parallel mapping (" + str() + ")";
  KIMIRT_CHECK(tp_size >= 1, "{}: tp_size must be at least 1, got {}", w, tp_size);
  KIMIRT_CHECK(ep_size >= 1, "{}: ep_size must be at least 1, got {}", w, ep_size);
  KIMIRT_CHECK(tp_rank >= 0 && tp_rank < tp_size, "{}: tp_rank {} is outside [0, {})", w, tp_rank, tp_size);
  KIMIRT_CHECK(ep_rank >= 0 && ep_rank < ep_size, "{}: ep_rank {} is outside [0, {})", w, ep_rank, ep_size);
  KIMIRT_CHECK(tp_size % ep_size == 0, "{}: ep_size ({}) must divide tp_size ({}) (moe_tp x moe_ep == tp)", w, ep_size,
               tp_size);
  KIMIRT_CHECK(ep_rank == tp_rank % ep_size, "{}: ep_rank must be tp_rank mod ep_size ({})", w, tp_rank % ep_size);
  KIMIRT_CHECK(!attention_dp || moe_tp_size() == 1,
               "{}: MoE tensor parallelism (moe_tp {}) requires attention-DP off; use ep_size == tp_size", w,
               moe_tp_size());
}

void ParallelMapping::validate(const ModelConfig& c) const {
  validate();
  const std::string w = "parallel mapping (" + str() + ")";
  if (!attention_dp) {
    KIMIRT_CHECK(!any_layer(c, LayerMixer::kKda) || c.kda_num_heads % tp_size == 0,
                 "{}: tp_size ({}) does not divide the KDA heads ({}); use attention-DP or another tp", w, tp_size,
                 c.kda_num_heads);
    KIMIRT_CHECK(!any_layer(c, LayerMixer::kMla) || c.mla_num_heads % tp_size == 0,
                 "{}: tp_size ({}) does not divide the MLA heads ({}); use attention-DP or another tp", w, tp_size,
                 c.mla_num_heads);
  }
  KIMIRT_CHECK(c.vocab_size % tp_size == 0, "{}: tp_size ({}) does not divide vocab_size ({}) (lm_head rows)", w,
               tp_size, c.vocab_size);
  if (c.num_experts > 0) {
    KIMIRT_CHECK(c.num_experts % ep_size == 0, "{}: ep_size ({}) does not divide num_experts ({})", w, ep_size,
                 c.num_experts);
    KIMIRT_CHECK(c.moe_intermediate_size % moe_tp_size() == 0,
                 "{}: moe_tp ({}) does not divide moe_intermediate_size ({})", w, moe_tp_size(),
                 c.moe_intermediate_size);
  }
}

int mlp_tp_size(int tp_size, int64_t width) {
  for (int g = tp_size; g > 1; --g) {
    if (tp_size % g == 0 && width % g == 0) return g;
  }
  return 1;
}

std::string_view slice_kind_name(SliceKind kind) {
  switch (kind) {
    case SliceKind::kWhole:
      return "whole";
    case SliceKind::kRows:
      return "rows";
    case SliceKind::kColumns:
      return "columns";
    case SliceKind::kFusedRows:
      return "fused rows";
    case SliceKind::kNotHeld:
      return "not held";
  }
  return "?";
}

std::string ParamSlice::describe() const {
  const std::string full = shape_str(spec->shape);
  switch (kind) {
    case SliceKind::kWhole:
      return "whole " + full;
    case SliceKind::kRows:
      return fmt::format("rows [{}, {}) of {}", begin, end, full);
    case SliceKind::kColumns:
      return fmt::format("columns [{}, {}) of {}", begin, end, full);
    case SliceKind::kFusedRows:
      return fmt::format("rows [{}, {}) of each of {} stacked {}", begin, end, spec->sources.size(),
                         shape_str(spec->sources[0].shape));
    case SliceKind::kNotHeld:
      return fmt::format("not held (expert {} lives on another EP rank)", spec->expert);
  }
  return "?";
}

ParamSlice slice_param(const Schema& schema, const ParamSpec& spec, const ParallelMapping& m) {
  ParamSlice out = slice_logical(schema.config(), spec, m);
  if (out.held()) add_component_slices(schema, out);
  return out;
}

ParamSlice slice_logical(const ModelConfig& c, const ParamSpec& spec, const ParallelMapping& m) {
  ParamSlice out;
  out.spec = &spec;
  if (spec.expert >= 0) {
    const int64_t per_rank = c.num_experts / m.ep_size;
    const int64_t first = m.ep_rank * per_rank;
    if (spec.expert < first || spec.expert >= first + per_rank) {
      out.kind = SliceKind::kNotHeld;
      return out;
    }
    out.local_expert = static_cast<int32_t>(spec.expert - first);
  }
  const Cut cut = choose_cut(c, spec, m);
  if (cut.dim < 0 || cut.parts == 1) {
    out.kind = SliceKind::kWhole;
    out.begin = 0;
    out.end = spec.shape[0];
    out.logical = stacked(spec, 0, 0, spec.sources[0].shape[0]);
  } else {
    const auto [b, e] = piece(cut.total, cut.parts, cut.index);
    out.begin = b * cut.unit;
    out.end = e * cut.unit;
    out.kind = cut.dim == 1 ? SliceKind::kColumns : spec.sources.size() > 1 ? SliceKind::kFusedRows : SliceKind::kRows;
    out.logical = stacked(spec, cut.dim, out.begin, out.end);
  }
  out.local_shape = out.logical.dst_shape;
  return out;
}

std::vector<ParamSlice> slice_all(const Schema& schema, const ParallelMapping& mapping) {
  mapping.validate(schema.config());
  std::vector<ParamSlice> out;
  out.reserve(schema.params().size());
  for (const auto& spec : schema.params()) out.push_back(slice_param(schema, spec, mapping));
  return out;
}

}  // namespace kimirt::model
