#include "kimirt/cli/value_check.h"

#include <map>
#include <optional>

#include "kimirt/base/progress.h"
#include "kimirt/base/timer.h"
#include "kimirt/io/read_engine.h"
#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/finite_values.h"

namespace kimirt::cli {
namespace {

// One tensor being counted; its pieces arrive in order from one I/O thread (io::ReadSink).
struct Counted {
  const io::TensorInfo* info = nullptr;
  const io::SafetensorsFile* shard = nullptr;
  NonfiniteCount count;
};

class CountingSink : public io::ReadSink {
 public:
  explicit CountingSink(std::vector<Counted>& counted) : counted_(counted) {}
  void consume(const io::Piece& piece) override { counted_[piece.id].count.add(piece.data, piece.size); }
  std::string describe(uint64_t id) const override { return counted_[id].info->name; }

 private:
  std::vector<Counted>& counted_;
};

// The dtype a tensor's values are counted as: its own, or E8M0 for the U8 block scales of an MXFP4 weight;
// nullopt for a tensor without NaN or infinity codes.
std::optional<DType> counted_dtype(const std::string& name, DType dtype,
                                   const std::map<std::string, quant::WeightFormat>& format_of) {
  if (dtype == DType::kU8) {
    const auto dot = name.rfind('.');
    if (dot == std::string::npos) return std::nullopt;
    const auto it = format_of.find(name.substr(0, dot));
    if (it == format_of.end() || it->second != quant::WeightFormat::kMxfp4) return std::nullopt;
    const int c = quant::component_index(it->second, std::string_view(name).substr(dot + 1));
    if (c < 0 || quant::format_components(it->second)[c].role != quant::ComponentRole::kBlockScale) {
      return std::nullopt;
    }
    return DType::kF8E8M0;
  }
  if (!has_nonfinite_codes(dtype)) return std::nullopt;
  return dtype;
}

}  // namespace

ValueCheck check_values(const io::Checkpoint& checkpoint, const std::map<std::string, quant::WeightFormat>& format_of,
                        bool progress) {
  const Timer timer;
  ValueCheck check;
  std::vector<Counted> counted;
  std::vector<io::FileRanges> files;
  for (const auto& shard : checkpoint.shards()) {
    io::FileRanges f{&shard, {}};
    for (const auto& info : shard.tensors()) {  // in data order: ascending offsets
      const auto dtype = counted_dtype(info.name, info.dtype, format_of);
      if (!dtype) {
        ++check.skipped;
        continue;
      }
      if (info.nbytes() == 0) {  // nothing to read: finite
        ++check.tensors;
        continue;
      }
      f.ranges.push_back({shard.absolute_offset(info), info.nbytes(), counted.size()});
      counted.push_back({&info, &shard, NonfiniteCount(*dtype)});
      check.bytes += info.nbytes();
    }
    if (!f.ranges.empty()) files.push_back(std::move(f));
  }
  check.tensors += counted.size();
  ProgressBar bar("checking values", check.bytes, progress && ProgressBar::stderr_is_terminal());
  io::ReadOptions options;
  options.progress = &bar;
  // Only the counted tensors' bytes: the packed weights between them are not read to bridge a gap (so the bar's
  // total and the bytes said read are what the reads move).
  options.max_gap_bytes = 0;
  CountingSink sink(counted);
  io::read_ranges(files, sink, options);
  bar.finish();
  for (const auto& c : counted) {
    if (c.count.nonfinite() == 0) continue;
    check.nonfinite.push_back({c.info->name, c.shard->path().filename().string(),
                               std::string(dtype_name(c.count.dtype())), c.count.elements(), c.count.nonfinite(),
                               c.count.first()});
  }
  check.seconds = timer.seconds();
  return check;
}

}  // namespace kimirt::cli
