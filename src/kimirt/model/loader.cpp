#include "kimirt/model/loader.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/base/log.h"
#include "kimirt/base/progress.h"
#include "kimirt/base/timer.h"
#include "kimirt/model/expert_stream.h"
#include "kimirt/quant/scale_codes.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt::model {
namespace {

// Routes the read engine's pieces: each piece is cut against the copy blocks of its read, and every part
// that falls inside a block becomes a StagedWrite to the block's destination.
class PlanExecutor final : public io::ReadSink {
 public:
  PlanExecutor(const LoadPlan& plan, LoadTarget& target, ExpertStream& experts)
      : plan_(plan), target_(target), experts_(experts), written_(new std::atomic<uint64_t>[plan.dests().size()]) {
    for (size_t d = 0; d < plan.dests().size(); ++d) written_[d].store(0);
    // Created up front, so that the I/O threads only look entries up (no insertion races).
    for (size_t r = 0; r < plan.reads().size(); ++r) {
      if (plan.reads()[r].check_values || plan.reads()[r].check_scales_whole) scratch_[r];
    }
  }

  void consume(const io::Piece& piece) override {
    const PlannedRead& read = plan_.reads()[piece.id];
    if (read.check_scales_whole) {
      // Delivered as it comes (copies from the staging ring stay asynchronous) and gathered, then checked once
      // whole: a bad scale fails the load, and the target drops what it got.
      std::vector<uint8_t>* scratch = gather(read, piece);
      deliver(read, piece.data, piece.range_offset, piece.size, piece.staging_slot);
      if (!scratch) return;
      StagedWrite whole;
      whole.dest = read.blocks.front().dest;
      whole.src = scratch->data();
      whole.src_pitch = whole.width = read.length;
      whole.rows = 1;
      with_context([&] { return where(read); }, [&] { check_scales(read, whole, 0); });
      std::vector<uint8_t>().swap(*scratch);
      return;
    }
    if (!read.check_values) {
      deliver(read, piece.data, piece.range_offset, piece.size, piece.staging_slot);
      return;
    }
    std::vector<uint8_t>* scratch = gather(read, piece);
    if (!scratch) return;
    const TensorView stored(read.info->dtype, read.info->shape, scratch->data());
    with_context([&] { return read.shard->path().filename().string(); },
                 [&] { (void)plan_.schema().normalize(*read.spec, read.source, read.component, stored, read.key); });
    deliver(read, scratch->data(), 0, read.length, -1);
    std::vector<uint8_t>().swap(*scratch);
  }

  bool asynchronous() const override { return target_.writes_async(); }
  void fence(int staging_slot) override { target_.fence(staging_slot); }
  std::string describe(uint64_t id) const override { return id < plan_.reads().size() ? plan_.reads()[id].key : ""; }

  // Every destination got exactly its bytes (the plan's blocks tile each one; this catches a piece lost on
  // the way, which would otherwise leave zeros in a "loaded" weight).
  void check_complete() const {
    for (size_t d = 0; d < plan_.dests().size(); ++d) {
      const PlannedDest& dest = plan_.dests()[d];
      const uint64_t got = written_[d].load();
      if (got != dest.bytes) {
        const PlannedParam& p = plan_.params()[dest.param];
        fail("{}: component {} received {} of its {} bytes", p.spec->name,
             quant::format_components(p.format)[static_cast<size_t>(dest.component)].suffix, got, dest.bytes);
      }
    }
  }

  uint64_t e8m0_zero_scales() const { return e8m0_zeros_.load(); }

 private:
  void deliver(const PlannedRead& read, const uint8_t* data, uint64_t a, uint64_t n, int slot) {
    const uint64_t end = a + n;
    for (const CopyBlock& b : read.blocks) {
      if (b.src_offset >= end) break;  // blocks are sorted by src_offset
      if (b.src_end() <= a) continue;
      emit(read, b, data, a, end, slot);
    }
  }

  // The part of block `b` of `read` inside read bytes [a, end), which are at `data`.
  void emit(const PlannedRead& read, const CopyBlock& b, const uint8_t* data, uint64_t a, uint64_t end,
            int staging_slot) {
    const int32_t slot = plan_.params()[plan_.dests()[b.dest].param].slot;
    if (slot >= 0) experts_.arriving(slot);
    const uint64_t pitch = b.src_pitch;
    uint64_t i = a <= b.src_offset ? 0 : (a - b.src_offset) / pitch;
    if (b.src_offset + i * pitch + b.width <= a) ++i;  // `a` falls between rows
    const uint64_t stop = std::min(b.rows, (end - b.src_offset + pitch - 1) / pitch);
    uint64_t bytes = 0;
    while (i < stop) {
      const uint64_t row = b.src_offset + i * pitch;
      const uint64_t lo = std::max(row, a), hi = std::min(row + b.width, end);
      uint64_t rows = 1;
      if (lo == row && hi == row + b.width) {
        // Whole rows from here on, up to the last row that ends inside the piece.
        const uint64_t last_full = end >= b.src_offset + b.width ? (end - b.src_offset - b.width) / pitch + 1 : 0;
        rows = std::min(stop, last_full) - i;
      }
      StagedWrite w;
      w.dest = b.dest;
      w.dst_offset = b.dst_offset + i * b.dst_pitch + (lo - row);
      w.dst_pitch = b.dst_pitch;
      w.src = data + (lo - a);
      w.src_pitch = pitch;
      w.width = hi - lo;
      w.rows = rows;
      w.staging_slot = staging_slot;
      // The target (a failed device copy, say) does not know which tensor it was moving; the name is formatted
      // only then (this runs for every staged piece).
      with_context([&] { return where(read); },
                   [&] {
                     if (plan_.dests()[b.dest].scale != quant::ScaleCode::kNone && !read.check_scales_whole) {
                       const uint64_t trimmed = read.offset - read.shard->absolute_offset(*read.info);
                       check_scales(read, w, trimmed + a + (w.src - data));
                     }
                     target_.write(w);
                   });
      bytes += w.width * rows;
      i += rows;
    }
    if (bytes == 0) return;
    written_[b.dest].fetch_add(bytes);
    if (slot >= 0) experts_.landed(slot, bytes);
  }

  // Copies a piece into its read's scratch (the pieces of one read arrive in order from one thread, so it needs
  // no lock); the whole read once its last piece is in, else null.
  std::vector<uint8_t>* gather(const PlannedRead& read, const io::Piece& piece) {
    auto& scratch = scratch_.at(piece.id);
    if (piece.range_offset == 0) scratch.resize(read.length);
    std::memcpy(scratch.data() + piece.range_offset, piece.data, piece.size);
    return piece.range_offset + piece.size < read.length ? nullptr : &scratch;
  }

  // "shard: key", what an error while moving a read's bytes is prefixed with.
  static std::string where(const PlannedRead& read) {
    return fmt::format("{}: {}", read.shard->path().filename().string(), read.key);
  }

  // A block scale that decodes to NaN, infinity, a negative number or one so large that its weights overflow float
  // is refused (its weights would be NaN, infinite or sign-flipped, silently); E8M0 code 0x00, which readers
  // decode differently, is counted
  // (LoadStats::e8m0_zero_scales). `offset`: the byte of the stored tensor that w's first row starts at
  // (one-byte codes come piece by piece, wider scales whole).
  void check_scales(const PlannedRead& read, const StagedWrite& w, uint64_t offset) {
    const quant::ScaleCode code = plan_.dests()[w.dest].scale;
    const DType dtype = read.info->dtype;
    const uint64_t element = static_cast<uint64_t>(dtype_bits(dtype) / 8);
    uint64_t zeros = 0;
    for (uint64_t r = 0; r < w.rows; ++r) {
      const uint8_t* row = w.src + r * w.src_pitch;
      const quant::ScaleCodeCount n = quant::count_scale_codes(code, dtype, row, w.width / element);
      zeros += n.e8m0_zero;
      if (n.invalid == 0) continue;
      const uint64_t at = (offset + r * w.src_pitch) / element + n.first_invalid;
      const Shape& shape = read.info->shape;
      const uint64_t cols = shape.empty() ? 1 : static_cast<uint64_t>(shape_numel(shape) / shape[0]);
      const uint8_t* value = row + n.first_invalid * element;
      std::string what;
      const char* weights = "so";  // what every weight it scales would be
      if (code == quant::ScaleCode::kFloat) {
        double d = 0.0;
        if (dtype == DType::kF64) {
          std::memcpy(&d, value, sizeof d);
        } else {
          float f = 0.0f;
          convert_to_f32(dtype, value, &f, 1);
          d = f;
        }
        const bool finite = std::isfinite(static_cast<float>(d));
        what = fmt::format("{} ({} {})",
                           !finite ? "NaN or infinity"
                           : d < 0 ? "a negative number"
                                   : "a number so large that E4M3 weights (up to 448) overflow",
                           dtype_name(dtype), d);
        weights = !finite ? "so" : d < 0 ? "sign-flipped" : "infinite where large";
      } else if (code == quant::ScaleCode::kE8M0 && *value != 0xFF) {
        what = fmt::format("2^{}, so large that E2M1 values (up to 6) overflow ({} code {:#04x})", *value - 127,
                           dtype_name(dtype), *value);
        weights = "infinite where large";
      } else {
        const bool negative = (*value & 0x7F) != 0x7F && code == quant::ScaleCode::kE4M3;
        what = fmt::format("{} ({} code {:#04x})", negative ? "a negative number" : "NaN", dtype_name(dtype), *value);
        weights = negative ? "sign-flipped" : "so";
      }
      fail("block scale {} (row {}, column {}) decodes to {}: every weight it scales would be {}", at, at / cols,
           at % cols, what, weights);
    }
    if (zeros) e8m0_zeros_.fetch_add(zeros);
  }

  const LoadPlan& plan_;
  LoadTarget& target_;
  ExpertStream& experts_;
  std::unique_ptr<std::atomic<uint64_t>[]> written_;
  std::unordered_map<uint64_t, std::vector<uint8_t>> scratch_;  // reads checked whole (A_log, float scales)
  std::atomic<uint64_t> e8m0_zeros_{0};
};

}  // namespace

LoadStats execute_plan(const LoadPlan& plan, LoadTarget& target, const LoadOptions& options) {
  const Timer timer;
  LoadStats stats;
  try {
    target.begin(plan);
    ExpertStream experts(plan.expert_slots(), target);
    PlanExecutor executor(plan, target, experts);
    const auto files = plan.file_ranges();
    ProgressBar bar("loading", plan.read_bytes(), options.progress && ProgressBar::stderr_is_terminal());
    io::ReadOptions ro;
    ro.staging_bytes = options.staging_bytes;
    ro.io_threads = options.io_threads;
    ro.allocator = target.staging_allocator();
    ro.progress = &bar;
    stats.read = io::read_ranges(files, executor, ro);
    bar.finish();
    executor.check_complete();
    experts.check_complete();
    stats.expert_layers_finalized = experts.layers_finalized();
    stats.e8m0_zero_scales = executor.e8m0_zero_scales();
    stats.dest_bytes = plan.dest_bytes();
    target.finish();
  } catch (...) {
    target.abandon();
    throw;
  }
  stats.seconds = timer.seconds();
  return stats;
}

void load_into(LoadTarget& target, const io::Checkpoint& checkpoint, const Schema& schema,
               const ParallelMapping& mapping, const LoadOptions& options) {
  const LoadPlan plan = LoadPlan::build(checkpoint, schema, mapping, options.strict);
  const LoadStats stats = execute_plan(plan, target, options);
  log::debug("{}: loaded {} parameters ({}) for {} in {:.2f} s ({:.2f} GB/s read, {} preads, staging peak {})",
             checkpoint.dir().string(), plan.params().size(), format_bytes(stats.dest_bytes), mapping.str(),
             stats.seconds, stats.seconds > 0 ? static_cast<double>(stats.read.bytes_read) / stats.seconds / 1e9 : 0.0,
             stats.read.preads, format_bytes(stats.read.peak_staging_bytes));
  if (stats.e8m0_zero_scales > 0) {
    log::warn(
        "{}: {} MXFP4 block scales hold E8M0 code 0x00, which readers decode as 2^-127 or as zero (their "
        "32 weights are zeros or nearly so either way); released K3 checkpoints hold none",
        checkpoint.dir().string(), stats.e8m0_zero_scales);
  }
}

ParamStore load_params(const io::Checkpoint& checkpoint, const Schema& schema, const ParallelMapping& mapping,
                       const LoadOptions& options) {
  ParamStoreTarget target;
  load_into(target, checkpoint, schema, mapping, options);
  return target.take();
}

struct ParamStoreTarget::State {
  const LoadPlan* plan = nullptr;
  std::vector<Tensor> tensors;  // per destination
  std::unique_ptr<std::once_flag[]> allocated;
};

ParamStoreTarget::ParamStoreTarget() = default;
ParamStoreTarget::~ParamStoreTarget() = default;

void ParamStoreTarget::begin(const LoadPlan& plan) {
  state_ = std::make_unique<State>();
  state_->plan = &plan;
  state_->tensors.resize(plan.dests().size());
  state_->allocated.reset(new std::once_flag[plan.dests().size()]);
  store_ = ParamStore();
}

void ParamStoreTarget::write(const StagedWrite& w) {
  State& st = *state_;
  const PlannedDest& dest = st.plan->dests()[w.dest];
  // The plan fills every destination byte exactly once, so the tensor need not be zeroed first.
  std::call_once(st.allocated[w.dest], [&] { st.tensors[w.dest] = Tensor::uninitialized(dest.dtype, dest.shape); });
  KIMIRT_ASSERT(w.rows == 0 || w.dst_offset + (w.rows - 1) * w.dst_pitch + w.width <= dest.bytes);
  auto* dst = static_cast<uint8_t*>(st.tensors[w.dest].data()) + w.dst_offset;
  if (w.rows == 1 || (w.src_pitch == w.width && w.dst_pitch == w.width)) {
    std::memcpy(dst, w.src, w.width * w.rows);
    return;
  }
  for (uint64_t r = 0; r < w.rows; ++r) std::memcpy(dst + r * w.dst_pitch, w.src + r * w.src_pitch, w.width);
}

void ParamStoreTarget::finish() {
  State& st = *state_;
  const LoadPlan& plan = *st.plan;
  ParamStore store;
  for (const PlannedParam& p : plan.params()) {
    LoadedParam lp;
    lp.spec = p.spec;
    lp.format = p.format;
    lp.shape = p.slice.local_shape;
    for (uint32_t d : p.dests) {
      const PlannedDest& dest = plan.dests()[d];
      // An empty tensor never receives a write.
      std::call_once(st.allocated[d], [&] { st.tensors[d] = Tensor(dest.dtype, dest.shape); });
      lp.component_ids.push_back(dest.component);
      lp.components.push_back(std::move(st.tensors[d]));
    }
    store.put(p.spec->name, std::move(lp));
  }
  store_ = std::move(store);
  state_.reset();
}

void ParamStoreTarget::abandon() noexcept {
  state_.reset();
  store_ = ParamStore();
}

ParamStore ParamStoreTarget::take() { return std::move(store_); }

LoadedModel load_model(const std::filesystem::path& dir, const ParallelMapping& mapping, const LoadOptions& options) {
  return load_model(io::Checkpoint::open(dir), mapping, options);
}

LoadedModel load_model(const io::Checkpoint& checkpoint, const ParallelMapping& mapping, const LoadOptions& options) {
  LoadedModel out;
  out.config = ModelConfig::from_json(checkpoint.config(), (checkpoint.dir() / "config.json").string());
  out.schema = std::make_unique<Schema>(Schema::for_checkpoint(out.config, checkpoint_keys(checkpoint)));
  out.params = load_params(checkpoint, *out.schema, mapping, options);
  return out;
}

}  // namespace kimirt::model
