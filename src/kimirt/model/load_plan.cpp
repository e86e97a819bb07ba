#include "kimirt/model/load_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/base/log.h"

namespace kimirt::model {
namespace {

constexpr size_t kListedKeys = 20;

// "a, b, c (and 7 more)": long key lists stay readable in one error line.
std::string list_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kListedKeys; ++i) {
    if (i) out += ", ";
    out += keys[i];
  }
  if (keys.size() > kListedKeys) out += fmt::format(" (and {} more)", keys.size() - kListedKeys);
  return out;
}

// Weights of a part the config turns off (AttnRes, the MLA output gate, the shared experts, an untied LM head):
// the model would run without what its weights were trained with, so the config and the checkpoint disagree, an
// error (tensors of a part no model here has, a vision tower say, are only warned about). A part's keys are
// those the same config with the part on expects beyond this one's.
void refuse_parts_switched_off(const Schema& schema, const std::vector<std::string>& unexpected,
                               const std::set<std::string>& known, const std::string& dir) {
  struct Part {
    const char* what;
    const char* field;
    const char* value;
    void (*on)(ModelConfig&);
    const char* fix;
  };
  const ModelConfig& c = schema.config();
  std::vector<Part> off;
  if (!c.has_attn_res()) {
    off.push_back({"block attention residual (AttnRes)", "attn_res_block_size", "0",
                   [](ModelConfig& m) { m.attn_res_block_size = std::max<int64_t>(m.num_layers, 1); },
                   "set it to the block size the checkpoint was trained with (Kimi K3: 12)"});
  }
  if (!c.mla_use_output_gate) {
    off.push_back({"MLA output gate", "mla_use_output_gate", "false",
                   [](ModelConfig& m) { m.mla_use_output_gate = true; }, "set it to true"});
  }
  if (c.num_experts > 0 && c.num_shared_experts == 0) {
    off.push_back({"shared expert", "num_shared_experts", "0", [](ModelConfig& m) { m.num_shared_experts = 1; },
                   "set it to the checkpoint's count"});
  }
  if (c.tie_word_embeddings) {
    off.push_back({"LM head", "tie_word_embeddings", "true", [](ModelConfig& m) { m.tie_word_embeddings = false; },
                   "set it to false (the head is its own tensor)"});
  }
  for (const Part& part : off) {
    ModelConfig with = c;
    part.on(with);
    std::set<std::string> keys;
    try {
      keys = Schema(with, schema.layout()).all_checkpoint_keys();
    } catch (const Error&) {
      continue;  // a configuration the part cannot be added to: nothing to compare
    }
    std::vector<std::string> found;
    for (const auto& key : unexpected) {
      if (keys.contains(key) && !known.contains(key)) found.push_back(key);
    }
    KIMIRT_CHECK(found.empty(),
                 "{}: {} {} tensor(s) are in the checkpoint, but the config's {} is {}, which runs the model without "
                 "them: {}, or remove the tensors: {}",
                 dir, found.size(), part.what, part.field, part.value, part.fix, list_keys(found));
  }
}

uint64_t element_bytes(DType dtype, std::string_view key) {
  const int bits = dtype_bits(dtype);
  KIMIRT_CHECK(bits % 8 == 0, "{}: {} elements are not whole bytes", key, dtype_name(dtype));
  return static_cast<uint64_t>(bits / 8);
}

Shape byte_strides(const Shape& shape, uint64_t element) {
  Shape s = contiguous_strides(shape);
  for (auto& v : s) v *= static_cast<int64_t>(element);
  return s;
}

class Builder {
 public:
  Builder(const io::Checkpoint& checkpoint, const Schema& schema, std::vector<PlannedParam>& params,
          std::vector<PlannedDest>& dests, std::vector<PlannedRead>& reads, std::vector<ExpertSlot>& slots)
      : checkpoint_(checkpoint), schema_(schema), params_(params), dests_(dests), reads_(reads), slots_(slots) {}

  void add(const ParamSlice& slice) {
    const ParamSpec& spec = *slice.spec;
    const auto p = static_cast<uint32_t>(params_.size());
    PlannedParam pp;
    pp.spec = &spec;
    pp.slice = slice;
    pp.format = spec.sources[0].format;
    for (const auto& cs : slice.components) {
      const auto d = static_cast<uint32_t>(dests_.size());
      std::vector<TensorView> canonical;
      for (size_t s = 0; s < cs.keys.size(); ++s) canonical.push_back(canonical_view(spec, s, cs));
      for (size_t s = 1; s < canonical.size(); ++s) {
        KIMIRT_CHECK(canonical[s].dtype() == canonical[0].dtype(),
                     "{}: {} is stored as {} but {} as {}; the halves of {} must share a dtype", checkpoint_dir(),
                     cs.keys[s], dtype_name(canonical[s].dtype()), cs.keys[0], dtype_name(canonical[0].dtype()),
                     spec.name);
      }
      PlannedDest dest;
      dest.param = p;
      dest.component = cs.component;
      dest.dtype = canonical[0].dtype();
      dest.shape = cs.rule.dst_shape;
      dest.bytes = *dtype_bytes(dest.dtype, static_cast<uint64_t>(shape_numel(dest.shape)));
      dest.scale = quant::block_scale_code(
          pp.format, quant::format_components(pp.format)[static_cast<size_t>(cs.component)], dest.dtype);
      const uint64_t element = element_bytes(dest.dtype, cs.keys[0]);
      uint64_t covered = 0;
      for (const auto& copy : cs.rule.copies) {
        const auto s = static_cast<size_t>(copy.source);
        PlannedRead& read = reads_[read_for(cs.keys[s], spec, s, cs.component, dest.scale == quant::ScaleCode::kFloat)];
        auto blocks = region_blocks(canonical[s].shape(), copy.src, dest.shape, copy.dst, element, d);
        for (const auto& b : blocks) covered += b.bytes();
        read.blocks.insert(read.blocks.end(), blocks.begin(), blocks.end());
      }
      KIMIRT_ASSERT(covered == dest.bytes);  // parallel's rules fill each local tensor exactly
      dests_.push_back(std::move(dest));
      pp.dests.push_back(d);
    }
    if (spec.expert >= 0) pp.slot = slot_for(spec, slice, p);
    params_.push_back(std::move(pp));
  }

  void finish_slots() {
    for (auto& slot : slots_) {
      for (uint32_t p : slot.params) {
        for (uint32_t d : params_[p].dests) slot.bytes += dests_[d].bytes;
      }
    }
  }

 private:
  std::string checkpoint_dir() const { return checkpoint_.dir().string(); }

  // The stored tensor as the slice rules see it (dtype and shape checked; no bytes yet).
  TensorView canonical_view(const ParamSpec& spec, size_t source, const ComponentSlice& cs) {
    const std::string& key = cs.keys[source];
    const auto& ref = checkpoint_.at(key);
    const TensorView stored(ref.info->dtype, ref.info->shape, nullptr);
    const std::string where = ref.shard->path().filename().string();
    if (spec.role == ParamRole::kKdaALog) {
      // Its padding can only be checked on the values (when read); dtype and shape are checked now.
      const int64_t heads = spec.sources[source].shape[0];
      // With num_heads = numel the check reads no value; with fewer values than heads it fails as it should.
      with_context(where, [&] { check_a_log_padding(stored, std::max(heads, stored.numel()), key); });
      return TensorView(stored.dtype(), spec.sources[source].shape, nullptr);
    }
    return with_context(
        where, [&] { return schema_.normalize(spec, source, static_cast<size_t>(cs.component), stored, key); });
  }

  uint32_t read_for(const std::string& key, const ParamSpec& spec, size_t source, int component, bool whole) {
    auto [it, fresh] = read_index_.try_emplace(key, static_cast<uint32_t>(reads_.size()));
    if (fresh) {
      const auto& ref = checkpoint_.at(key);
      PlannedRead r;
      r.key = key;
      r.shard = ref.shard;
      r.info = ref.info;
      r.check_values = spec.role == ParamRole::kKdaALog;
      r.check_scales_whole = whole;
      r.spec = &spec;
      r.source = static_cast<uint32_t>(source);
      r.component = static_cast<uint32_t>(component);
      reads_.push_back(std::move(r));
    }
    return it->second;
  }

  int32_t slot_for(const ParamSpec& spec, const ParamSlice& slice, uint32_t p) {
    auto [it, fresh] = slot_index_.try_emplace({spec.layer, slice.local_expert}, static_cast<int32_t>(slots_.size()));
    if (fresh) slots_.push_back({spec.layer, slice.local_expert, spec.expert, 0, {}});
    slots_[static_cast<size_t>(it->second)].params.push_back(p);
    return it->second;
  }

  const io::Checkpoint& checkpoint_;
  const Schema& schema_;
  std::vector<PlannedParam>& params_;
  std::vector<PlannedDest>& dests_;
  std::vector<PlannedRead>& reads_;
  std::vector<ExpertSlot>& slots_;
  std::unordered_map<std::string, uint32_t> read_index_;
  std::map<std::pair<int32_t, int32_t>, int32_t> slot_index_;
};

// Trims each read to the bytes its blocks use (rows a rank does not hold are not read) and makes the block
// offsets relative to the read.
void trim(PlannedRead& r) {
  uint64_t lo = 0, hi = r.info->nbytes();
  if (!r.check_values && !r.check_scales_whole && !r.blocks.empty()) {
    lo = UINT64_MAX;
    hi = 0;
    for (const auto& b : r.blocks) {
      lo = std::min(lo, b.src_offset);
      hi = std::max(hi, b.src_end());
    }
  }
  KIMIRT_ASSERT(lo <= hi && hi <= r.info->nbytes());
  for (auto& b : r.blocks) b.src_offset -= lo;
  std::sort(r.blocks.begin(), r.blocks.end(),
            [](const CopyBlock& a, const CopyBlock& b) { return a.src_offset < b.src_offset; });
  r.offset = r.shard->absolute_offset(*r.info) + lo;
  r.length = hi - lo;
}

}  // namespace

bool text_model_ignores(std::string_view key, std::string_view prefix) {
  for (const std::string_view p : {std::string_view("vision_tower."), std::string_view("mm_projector.")}) {
    if (key.starts_with(p) || (key.starts_with(prefix) && key.substr(prefix.size()).starts_with(p))) return true;
  }
  return false;
}

std::vector<CopyBlock> region_blocks(const Shape& src_shape, const quant::Region& src_region, const Shape& dst_shape,
                                     const quant::Region& dst_region, uint64_t element_bytes, uint32_t dest) {
  const size_t rank = src_shape.size();
  KIMIRT_ASSERT(dst_shape.size() == rank && src_region.begin.size() == rank && dst_region.begin.size() == rank &&
                src_region.extent == dst_region.extent);
  const Shape& extent = src_region.extent;
  for (size_t d = 0; d < rank; ++d) {
    KIMIRT_ASSERT(src_region.begin[d] >= 0 && src_region.begin[d] + extent[d] <= src_shape[d]);
    KIMIRT_ASSERT(dst_region.begin[d] >= 0 && dst_region.begin[d] + extent[d] <= dst_shape[d]);
  }
  const Shape ss = byte_strides(src_shape, element_bytes);
  const Shape ds = byte_strides(dst_shape, element_bytes);
  uint64_t src0 = 0, dst0 = 0;
  for (size_t d = 0; d < rank; ++d) {
    src0 += static_cast<uint64_t>(src_region.begin[d] * ss[d]);
    dst0 += static_cast<uint64_t>(dst_region.begin[d] * ds[d]);
  }
  std::vector<CopyBlock> out;
  if (shape_numel(extent) == 0) return out;
  if (rank == 0) {
    out.push_back({dest, src0, element_bytes, dst0, element_bytes, element_bytes, 1});
    return out;
  }
  // Dimensions k..rank-1 form one contiguous run on both sides: all but k are whole in both shapes.
  size_t k = rank - 1;
  uint64_t width = static_cast<uint64_t>(extent[k]) * element_bytes;
  while (k > 0 && extent[k] == src_shape[k] && extent[k] == dst_shape[k]) {
    --k;
    width *= static_cast<uint64_t>(extent[k]);
  }
  if (k == 0) {
    out.push_back({dest, src0, width, dst0, width, width, 1});
    return out;
  }
  // Dimension k-1 gives the rows of a block; the dimensions before it give one block per index.
  const size_t row_dim = k - 1;
  const auto rows = static_cast<uint64_t>(extent[row_dim]);
  Shape index(row_dim, 0);
  for (;;) {
    uint64_t s = src0, t = dst0;
    for (size_t d = 0; d < row_dim; ++d) {
      s += static_cast<uint64_t>(index[d] * ss[d]);
      t += static_cast<uint64_t>(index[d] * ds[d]);
    }
    out.push_back({dest, s, static_cast<uint64_t>(ss[row_dim]), t, static_cast<uint64_t>(ds[row_dim]), width, rows});
    size_t d = row_dim;
    while (d > 0 && ++index[d - 1] == extent[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

KeyIndex checkpoint_keys(const io::Checkpoint& checkpoint) {
  std::vector<KeyEntry> entries;
  for (const auto& shard : checkpoint.shards()) {
    const std::string file = shard.path().filename().string();
    for (const auto& info : shard.tensors()) entries.push_back({info.name, info.dtype, file});
  }
  return KeyIndex(std::move(entries));
}

LoadPlan LoadPlan::build(const io::Checkpoint& checkpoint, const Schema& schema, const ParallelMapping& mapping,
                         bool strict) {
  const std::string dir = checkpoint.dir().string();
  LoadPlan plan;
  plan.schema_ = &schema;
  plan.mapping_ = mapping;
  const std::vector<ParamSlice> slices = slice_all(schema, mapping);

  // Keys first: what is missing or unexpected is reported as a whole, before shapes are looked at.
  std::vector<std::string> missing;
  std::set<std::string> needed;
  for (const auto& slice : slices) {
    if (!slice.held()) continue;
    for (const auto& cs : slice.components) {
      for (const auto& key : cs.keys) {
        if (needed.insert(key).second && checkpoint.find(key) == nullptr) missing.push_back(key);
      }
    }
  }
  std::sort(missing.begin(), missing.end());
  KIMIRT_CHECK(missing.empty(), "{}: {} tensor(s) that this rank ({}) needs are missing from the checkpoint: {}", dir,
               missing.size(), mapping.str(), list_keys(missing));
  const std::set<std::string> known = schema.all_checkpoint_keys();
  for (const auto& name : checkpoint.tensor_names()) {
    if (!known.contains(name) && !text_model_ignores(name, schema.layout().prefix)) plan.unexpected_.push_back(name);
  }
  if (!plan.unexpected_.empty()) refuse_parts_switched_off(schema, plan.unexpected_, known, dir);
  if (!plan.unexpected_.empty()) {
    KIMIRT_CHECK(!strict, "{}: {} tensor(s) are not parameters of this {} model (strict loading): {}", dir,
                 plan.unexpected_.size(), family_name(schema.config().family), list_keys(plan.unexpected_));
    log::warn("{}: {} tensor(s) are not parameters of this {} model and are ignored: {}", dir, plan.unexpected_.size(),
              family_name(schema.config().family), list_keys(plan.unexpected_));
  }

  Builder builder(checkpoint, schema, plan.params_, plan.dests_, plan.reads_, plan.slots_);
  for (const auto& slice : slices) {
    if (slice.held()) builder.add(slice);
  }
  builder.finish_slots();
  for (auto& r : plan.reads_) trim(r);

  std::map<const io::SafetensorsFile*, uint32_t> file_of;
  for (const auto& shard : checkpoint.shards()) {
    file_of.emplace(&shard, static_cast<uint32_t>(plan.files_.size()));
    plan.files_.push_back({&shard, {}, 0});
  }
  for (uint32_t i = 0; i < plan.reads_.size(); ++i) {
    PlannedFile& f = plan.files_[file_of.at(plan.reads_[i].shard)];
    f.reads.push_back(i);
    f.bytes += plan.reads_[i].length;
  }
  std::erase_if(plan.files_, [](const PlannedFile& f) { return f.reads.empty(); });
  for (auto& f : plan.files_) {
    std::sort(f.reads.begin(), f.reads.end(),
              [&](uint32_t a, uint32_t b) { return plan.reads_[a].offset < plan.reads_[b].offset; });
  }
  return plan;
}

uint64_t LoadPlan::read_bytes() const {
  uint64_t n = 0;
  for (const auto& r : reads_) n += r.length;
  return n;
}

uint64_t LoadPlan::dest_bytes() const {
  uint64_t n = 0;
  for (const auto& d : dests_) n += d.bytes;
  return n;
}

std::vector<io::FileRanges> LoadPlan::file_ranges() const {
  std::vector<io::FileRanges> out;
  out.reserve(files_.size());
  for (const auto& f : files_) {
    io::FileRanges fr{f.shard, {}};
    fr.ranges.reserve(f.reads.size());
    for (uint32_t i : f.reads) fr.ranges.push_back({reads_[i].offset, reads_[i].length, i});
    out.push_back(std::move(fr));
  }
  return out;
}

}  // namespace kimirt::model
