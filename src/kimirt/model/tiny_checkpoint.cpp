#include "kimirt/model/tiny_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kimirt/base/error.h"
#include "kimirt/io/posix_file.h"
#include "kimirt/io/safetensors_writer.h"
#include "kimirt/io/shard_index.h"
#include "kimirt/model/schema.h"
#include "kimirt/model/tiny_values.h"
#include "kimirt/quant/weight_format.h"

namespace kimirt::model {
namespace {

namespace fs = std::filesystem;

// MLA every `period`-th layer (1-based) and the last, KDA elsewhere: the release's pattern.
std::vector<LayerMixer> layer_pattern(int64_t layers, int64_t period) {
  KIMIRT_CHECK(layers >= 1, "make-tiny: --layers must be at least 1, got {}", layers);
  KIMIRT_CHECK(period >= 1, "make-tiny: --mla-period must be at least 1, got {}", period);
  std::vector<LayerMixer> m(static_cast<size_t>(layers), LayerMixer::kKda);
  for (int64_t l = period; l <= layers; l += period) m[static_cast<size_t>(l - 1)] = LayerMixer::kMla;
  m.back() = LayerMixer::kMla;
  return m;
}

// One tensor of the checkpoint as it is stored, and which parameter component it holds.
struct Entry {
  std::string key;
  DType dtype = DType::kBF16;
  Shape shape;
  uint64_t bytes = 0;
  const ParamSpec* spec = nullptr;
  size_t source = 0;
  int component = 0;
};

bool stored_f32(ParamRole role) {
  switch (role) {
    case ParamRole::kKdaQConv:
    case ParamRole::kKdaKConv:
    case ParamRole::kKdaVConv:
    case ParamRole::kKdaALog:
    case ParamRole::kKdaDtBias:
    case ParamRole::kKdaONorm:
    case ParamRole::kRouterBias:
      return true;
    default:
      return false;
  }
}

// Every stored tensor of the model, in schema order (a tied lm_head adds none).
std::vector<Entry> stored_tensors(const Schema& schema) {
  const ModelConfig& c = schema.config();
  std::vector<Entry> out;
  std::set<std::string> seen;
  for (const auto& spec : schema.params()) {
    for (size_t s = 0; s < spec.sources.size(); ++s) {
      const ParamSource& src = spec.sources[s];
      const auto comps = quant::format_components(src.format);
      for (int ci : schema.stored_components(src)) {
        const auto& comp = comps[static_cast<size_t>(ci)];
        Entry e;
        e.key = schema.key(spec, src, comp);
        if (!seen.insert(e.key).second) continue;
        e.spec = &spec;
        e.source = s;
        e.component = ci;
        e.shape = quant::component_shape(src.format, comp, src.shape);
        if (src.format == quant::WeightFormat::kFloat) {
          e.dtype = stored_f32(spec.role) ? DType::kF32 : DType::kBF16;
          if (spec.role == ParamRole::kKdaALog) {
            // K3 pads A_log to head_dim with zeros; transformers' Kimi Linear keeps [1, 1, heads, 1].
            e.shape = c.family == ModelFamily::kKimiK3 ? Shape{std::max(c.kda_head_dim, c.kda_num_heads)}
                                                       : Shape{1, 1, c.kda_num_heads, 1};
          }
        } else if (comp.role == quant::ComponentRole::kData) {
          e.dtype = src.format == quant::WeightFormat::kMxfp4 ? DType::kU8 : DType::kF8E4M3;
        } else {
          e.dtype = src.format == quant::WeightFormat::kMxfp4 ? DType::kU8 : DType::kF32;
        }
        e.bytes = *dtype_bytes(e.dtype, static_cast<uint64_t>(shape_numel(e.shape)));
        out.push_back(std::move(e));
      }
    }
  }
  return out;
}

// Which entries go to which shard (indices into the entry list), in file order.
std::vector<std::vector<size_t>> plan_shards(const std::vector<Entry>& entries, int64_t num_layers,
                                             uint64_t shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  uint64_t filled = 0;
  auto open_shard = [&] {
    if (shards.empty() || !shards.back().empty()) shards.emplace_back();
    filled = 0;
  };
  auto add = [&](size_t i) {
    if (!shards.back().empty() && filled + entries[i].bytes > shard_bytes) open_shard();
    shards.back().push_back(i);
    filled += entries[i].bytes;
  };
  std::vector<size_t> model_level, lm_head;
  std::vector<std::vector<size_t>> trunk(static_cast<size_t>(num_layers)), experts(static_cast<size_t>(num_layers));
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParamSpec& spec = *entries[i].spec;
    if (spec.role == ParamRole::kLmHead) {
      lm_head.push_back(i);
    } else if (spec.layer < 0) {
      model_level.push_back(i);
    } else {
      (spec.expert >= 0 ? experts : trunk)[static_cast<size_t>(spec.layer)].push_back(i);
    }
  }
  open_shard();
  for (size_t i : model_level) add(i);
  open_shard();
  for (const auto& layer : trunk) {
    uint64_t layer_bytes = 0;
    for (size_t i : layer) layer_bytes += entries[i].bytes;
    // Whole layers per shard while they fit.
    if (!shards.back().empty() && filled + layer_bytes > shard_bytes) open_shard();
    for (size_t i : layer) add(i);
  }
  for (const auto& layer : experts) {
    if (layer.empty()) continue;
    open_shard();
    for (size_t i : layer) add(i);
  }
  open_shard();
  for (size_t i : lm_head) add(i);
  if (shards.back().empty()) shards.pop_back();
  return shards;
}

// Buffered sequential writes to one file; errors name it.
class FileWriter {
 public:
  explicit FileWriter(const fs::path& path) : path_(path) {
    fd_ = io::UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    KIMIRT_CHECK(fd_.valid(), "{}: cannot create: {}", path.string(), io::errno_text(errno));
    buffer_.reserve(kBuffer);
  }

  void append(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const size_t take = std::min(n, kBuffer - buffer_.size());
      buffer_.insert(buffer_.end(), p, p + take);
      p += take;
      n -= take;
      if (buffer_.size() == kBuffer) flush();
    }
  }

  // No fsync: the directory appears by one rename when complete, and a generated checkpoint is cheaper to
  // regenerate after a crash than an fsync per shard is on every run.
  void close() {
    flush();
    KIMIRT_CHECK(::close(fd_.release()) == 0, "{}: close failed: {}", path_.string(), io::errno_text(errno));
  }

 private:
  static constexpr size_t kBuffer = size_t{4} << 20;

  void flush() {
    const io::IoResult r = io::write_full(fd_.get(), buffer_.data(), buffer_.size());
    KIMIRT_CHECK(r.error == 0, "{}: write failed: {}", path_.string(), io::errno_text(r.error));
    buffer_.clear();
  }

  fs::path path_;
  io::UniqueFd fd_;
  std::vector<uint8_t> buffer_;
};

// The header the official serializer would write for these entries (in the order given: the data order),
// padded with spaces to a multiple of 8.
std::string shard_header(const std::vector<const Entry*>& order) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const Entry* e : order) {
    header[e->key] = {
        {"dtype", dtype_name(e->dtype)}, {"shape", e->shape}, {"data_offsets", {offset, offset + e->bytes}}};
    offset += e->bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_shard(const fs::path& path, const std::vector<Entry>& entries, const std::vector<size_t>& members,
                 uint64_t seed) {
  std::vector<const Entry*> order;
  for (size_t i : members) order.push_back(&entries[i]);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const int oa = io::safetensors_dtype_order(a->dtype), ob = io::safetensors_dtype_order(b->dtype);
    return oa != ob ? oa > ob : a->key < b->key;
  });
  const std::string header = shard_header(order);
  FileWriter out(path);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  out.append(length, 8);
  out.append(header.data(), header.size());
  for (const Entry* e : order) {
    const TinyTensor t{e->key, e->dtype, e->shape, e->spec, e->source, e->component};
    generate_tiny_tensor(t, seed, [&](const void* data, size_t n) { out.append(data, n); });
  }
  out.close();
}

std::string shard_name(size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n); }

nlohmann::json generation_config(const ModelConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j;
}

void write_text(const fs::path& path, const std::string& text) {
  FileWriter out(path);
  out.append(text.data(), text.size());
  out.close();
}

}  // namespace

ModelConfig tiny_config(ModelFamily family, const TinyDims& dims, ExpertStorage experts) {
  ModelConfig c;
  c.family = family;
  const bool k3 = family == ModelFamily::kKimiK3;
  c.vocab_size = dims.vocab.value_or(k3 ? 1024 : 512);
  c.hidden_size = dims.hidden.value_or(k3 ? 256 : 64);
  c.num_layers = dims.layers.value_or(k3 ? 6 : 5);
  c.layer_mixers = layer_pattern(c.num_layers, dims.mla_period.value_or(4));
  c.intermediate_size = dims.intermediate.value_or(k3 ? 512 : 128);
  c.first_k_dense_replace = std::min<int64_t>(1, c.num_layers);
  c.moe_layer_freq = 1;
  c.rms_norm_eps = 1e-5;
  const int64_t heads = dims.heads.value_or(4);
  const int64_t head_dim = dims.head_dim.value_or(k3 ? 32 : 16);
  c.mla_num_heads = heads;
  c.kv_lora_rank = dims.kv_lora_rank.value_or(32);
  c.qk_nope_head_dim = head_dim;
  c.qk_rope_head_dim = dims.rope_dim.value_or(k3 ? 16 : 8);
  c.v_head_dim = head_dim;
  c.kda_num_heads = heads;
  c.kda_head_dim = head_dim;
  c.kda_conv_kernel = 4;
  c.num_experts = dims.experts.value_or(k3 ? 16 : 8);
  // The default top-k shrinks with a small --experts; a --top-k given is taken as it is or refused.
  KIMIRT_CHECK(!dims.top_k || *dims.top_k <= c.num_experts,
               "make-tiny: --top-k ({}) is more than the experts per layer ({}, --experts)", dims.top_k.value_or(0),
               c.num_experts);
  c.num_experts_per_token = dims.top_k.value_or(std::min<int64_t>(k3 ? 4 : 2, c.num_experts));
  c.num_shared_experts = dims.shared_experts.value_or(k3 ? 2 : 1);
  c.moe_intermediate_size = dims.moe_intermediate.value_or(k3 ? 64 : 32);
  if (k3) {
    c.q_lora_rank = dims.q_lora_rank.value_or(64);
    c.mla_use_output_gate = true;
    c.kda_gate_lower_bound = -5.0;
    c.kda_use_full_rank_gate = true;
    c.routed_expert_hidden_size = dims.latent.value_or(128);
    c.latent_moe_use_norm = true;
    c.hidden_act = HiddenAct::kSitu;
    c.situ_beta = 4.0;
    c.situ_linear_beta = 25.0;
    c.attn_res_block_size = std::min<int64_t>(2, c.num_layers);
    // The release reserves the last 256 ids for special tokens (bos = vocab - 256, eos = bos + 2, pad last).
    if (c.vocab_size > 256) {
      c.bos_token_id = c.vocab_size - 256;
      c.eos_token_id = c.vocab_size - 254;
      c.media_placeholder_token_id = c.vocab_size - 235;
    }
    c.pad_token_id = c.vocab_size - 1;
  } else {
    KIMIRT_CHECK(!dims.q_lora_rank, "make-tiny: --q-lora-rank is a Kimi K3 dimension (Kimi Linear has a q_proj)");
    KIMIRT_CHECK(!dims.latent, "make-tiny: --latent is a Kimi K3 dimension (Kimi Linear's experts are not latent)");
    c.hidden_act = HiddenAct::kSilu;
    c.routed_scaling_factor = 2.446;
    c.bos_token_id = std::min<int64_t>(1, c.vocab_size - 1);
    c.eos_token_id = std::min<int64_t>(2, c.vocab_size - 1);
    c.pad_token_id = 0;
  }
  c.max_position_embeddings = 1048576;
  switch (experts) {
    case ExpertStorage::kMxfp4:
      c.quantization = QuantizationConfig::kimi_k3_mxfp4();
      break;
    case ExpertStorage::kBf16:
      c.quantization = QuantizationConfig();
      break;
    case ExpertStorage::kFp8:
      c.quantization = QuantizationConfig::fp8_block(QuantProvider::kCompressedTensors);
      c.quantization.ignore = QuantizationConfig::kimi_k3_mxfp4().ignore;  // only the routed experts are FP8
      break;
  }
  c.validate("make-tiny");
  return c;
}

uint64_t tiny_checkpoint_bytes(const ModelConfig& config) {
  const Schema schema(config, default_layout(config));
  uint64_t total = 0;
  for (const auto& e : stored_tensors(schema)) total += e.bytes;
  return total;
}

void scale_experts_to_size(ModelConfig& config, uint64_t target_bytes) {
  bool any_moe = false;
  for (int64_t l = 0; l < config.num_layers; ++l) any_moe |= config.is_moe_layer(l);
  KIMIRT_CHECK(any_moe,
               "make-tiny: --size-gb needs MoE layers to grow (num_experts > 0 and more layers than "
               "first_k_dense_replace)");
  ModelConfig c = config;
  c.num_experts = 8;
  c.num_experts_per_token = std::min(config.num_experts_per_token, c.num_experts);
  const uint64_t base = tiny_checkpoint_bytes(c);
  c.num_experts = 16;
  const uint64_t per8 = tiny_checkpoint_bytes(c) - base;  // the bytes of 8 more experts in every MoE layer
  uint64_t groups = 1;
  if (target_bytes > base) groups = 1 + (target_bytes - base + per8 - 1) / per8;
  // At least the experts a token takes: a top-k above the count is kept, not lowered to fit.
  const uint64_t min_groups = static_cast<uint64_t>((config.num_experts_per_token + 7) / 8);
  config.num_experts = static_cast<int64_t>(std::max(groups, min_groups) * 8);
  config.validate("make-tiny");
}

TinyCheckpointInfo write_tiny_checkpoint(const fs::path& dir_in, const ModelConfig& config,
                                         const TinyCheckpointOptions& options) {
  config.validate("make-tiny");
  KIMIRT_CHECK(options.shard_bytes > 0, "make-tiny: the shard size must be positive");
  const fs::path dir = dir_in.has_filename() ? dir_in : dir_in.parent_path();
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    KIMIRT_CHECK(fs::is_directory(dir, ec) && fs::is_empty(dir, ec), "{}: exists and is not an empty directory",
                 dir.string());
  }
  for (const auto& f : options.side_files) {
    KIMIRT_CHECK(fs::is_regular_file(f, ec), "{}: no such file to copy into the checkpoint", f.string());
  }
  const Schema schema(config, default_layout(config));
  const std::vector<Entry> entries = stored_tensors(schema);
  const auto shards = plan_shards(entries, config.num_layers, options.shard_bytes);

  const fs::path tmp = dir.parent_path() / fmt::format(".{}.partial-{}", dir.filename().string(), ::getpid());
  fs::remove_all(tmp, ec);
  TinyCheckpointInfo info;
  try {
    fs::create_directories(tmp);
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = shard_name(s, shards.size());
      write_shard(tmp / name, entries, shards[s], options.seed);
      for (size_t i : shards[s]) {
        weight_map[entries[i].key] = name;
        info.tensor_bytes += entries[i].bytes;
        ++info.tensors;
      }
    }
    info.shards = shards.size();
    const nlohmann::json index = {{"metadata", {{"total_size", info.tensor_bytes}}}, {"weight_map", weight_map}};
    write_text(tmp / std::string(io::kShardIndexFileName), index.dump(2) + "\n");
    write_text(tmp / "config.json", config.to_json().dump(2) + "\n");
    write_text(tmp / "generation_config.json", generation_config(config).dump(2) + "\n");
    for (const auto& f : options.side_files) fs::copy_file(f, tmp / f.filename());
    if (options.add_files) options.add_files(tmp);
    if (fs::exists(dir, ec)) fs::remove(dir);  // the empty directory it replaces
    fs::rename(tmp, dir);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    fail("{}: {}", dir.string(), e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return info;
}

}  // namespace kimirt::model
