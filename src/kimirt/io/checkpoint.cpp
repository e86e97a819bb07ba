#include "kimirt/io/checkpoint.h"

#include <algorithm>
#include <map>
#include <system_error>

#include <fmt/format.h>

#include "kimirt/base/log.h"
#include "kimirt/base/path_lookup.h"
#include "kimirt/base/strict_json.h"
#include "kimirt/io/posix_file.h"

namespace kimirt::io {

namespace fs = std::filesystem;
using Kind = CheckpointError::Kind;

namespace {

constexpr std::string_view kConfigFileName = "config.json";
constexpr std::string_view kSingleFileName = "model.safetensors";
constexpr uint64_t kMaxConfigBytes = uint64_t{64} << 20;

bool is_inside_relative(std::string_view relative) {
  if (relative.empty()) return false;
  const fs::path p(relative);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

// Opens a checkpoint while either throwing the first error (open) or collecting all (validate): one walk,
// so the two can never disagree about what is wrong.
class CheckpointBuilder {
 public:
  explicit CheckpointBuilder(std::vector<std::string>* errors) : errors_(errors) {}

  Checkpoint build(const fs::path& dir) {
    Checkpoint c;
    c.dir_ = dir;
    const PathLookup there = presence(dir);
    if (there != PathLookup::kPresent) {
      if (there == PathLookup::kAbsent) {
        error(CheckpointError(Kind::kNotADirectory, fmt::format("{}: no such checkpoint directory", dir.string())));
      }
      return c;
    }
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      error(CheckpointError(Kind::kNotADirectory, fmt::format("{}: not a directory", dir.string())));
      return c;
    }
    load_config(c);
    const fs::path index_path = dir / kShardIndexFileName;
    const fs::path single_path = dir / kSingleFileName;
    const PathLookup index = presence(index_path);
    if (index == PathLookup::kPresent) {
      load_index(c, index_path);
      const auto& files = c.index_->files();
      if (fs::exists(single_path, ec) && !std::binary_search(files.begin(), files.end(), kSingleFileName)) {
        warn(fmt::format("{}: {} is not named by the index and is ignored", dir.string(), kSingleFileName));
      }
    } else if (index == PathLookup::kAbsent) {
      const PathLookup single = presence(single_path);
      if (single == PathLookup::kPresent) {
        open_shard(c, single_path);
      } else if (single == PathLookup::kAbsent) {
        error(CheckpointError(Kind::kNoWeights, fmt::format("{}: neither {}{} nor {}{}", dir.string(),
                                                            kShardIndexFileName, dangling_link_note(index_path),
                                                            kSingleFileName, dangling_link_note(single_path))));
      }
    }
    std::sort(c.shards_.begin(), c.shards_.end(),
              [](const SafetensorsFile& a, const SafetensorsFile& b) { return a.path() < b.path(); });
    link_tensors(c);
    if (c.index_) check_index(c, index_path);
    return c;
  }

  std::vector<std::string> take_warnings() { return std::move(warnings_); }

 private:
  template <typename E>
  void error(const E& e) {
    if (errors_ == nullptr) throw e;
    errors_->push_back(e.what());
  }

  void warn(std::string message) { warnings_.push_back(std::move(message)); }

  // look_up (kimirt/base/path_lookup.h), a failed lookup reported as such, naming the path, not as an absence.
  PathLookup presence(const fs::path& path) {
    std::string why;
    const PathLookup found = look_up(path, &why);
    if (found == PathLookup::kFailed) {
      error(CheckpointError(Kind::kIo, fmt::format("{}: cannot be looked up: {}", path.string(), why)));
    }
    return found;
  }

  void load_config(Checkpoint& c) {
    const fs::path path = c.dir_ / kConfigFileName;
    const PathLookup found = presence(path);
    if (found != PathLookup::kPresent) {
      if (found == PathLookup::kAbsent) {
        error(CheckpointError(Kind::kMissingConfig,
                              fmt::format("{}: no {}{}", c.dir_.string(), kConfigFileName, dangling_link_note(path))));
      }
      return;
    }
    std::string text;
    if (int err = read_whole_file(path.c_str(), kMaxConfigBytes, text); err != 0) {
      error(CheckpointError(Kind::kIo,
                            fmt::format("{}: cannot read: {}", path.string(), file_error_text(err, kMaxConfigBytes))));
      return;
    }
    JsonProblem problem;
    auto config = parse_json_strict(text, problem);
    if (!config) {
      error(
          CheckpointError(problem.kind == JsonProblem::Kind::kDuplicateKey ? Kind::kDuplicateKey : Kind::kInvalidConfig,
                          fmt::format("{}: {}", path.string(), problem.message)));
      return;
    }
    if (!config->is_object()) {
      error(CheckpointError(Kind::kInvalidConfig,
                            fmt::format("{}: must be a JSON object, not {}", path.string(), config->type_name())));
      return;
    }
    c.config_ = std::move(*config);
  }

  void load_index(Checkpoint& c, const fs::path& index_path) {
    if (errors_ == nullptr) {
      c.index_ = ShardIndex::read(index_path);
    } else {
      std::vector<CheckpointError> problems;
      c.index_ = ShardIndex::read(index_path, problems);
      for (const auto& p : problems) error(p);
    }
    const ShardIndex& index = *c.index_;
    std::vector<size_t> count(index.files().size(), 0);
    std::vector<const std::string*> example(index.files().size(), nullptr);
    for (const auto& e : index.entries()) {
      if (count[e.file]++ == 0) example[e.file] = &e.name;
    }
    for (size_t f = 0; f < index.files().size(); ++f) {
      const fs::path path = c.dir_ / index.files()[f];
      // Only an absent file is a missing shard: one that is there but is no regular file is open_shard's to
      // report, with its reason, and a failed lookup presence()'s.
      const PathLookup shard = presence(path);
      if (shard == PathLookup::kFailed) continue;
      if (shard == PathLookup::kAbsent) {
        error(CheckpointError(Kind::kMissingShard,
                              fmt::format("{}: names shard {} for {} tensor(s) (e.g. '{}'), but {} has no such file{}",
                                          index_path.string(), index.files()[f], count[f], *example[f], c.dir_.string(),
                                          dangling_link_note(path))));
        continue;
      }
      open_shard(c, path);
    }
    for (const auto& key : index.unknown_keys()) {
      warn(fmt::format("{}: unknown top-level key \"{}\" ignored", index_path.string(), key));
    }
  }

  void open_shard(Checkpoint& c, const fs::path& path) {
    try {
      c.shards_.push_back(SafetensorsFile::open(path));
    } catch (const SafetensorsError& e) {
      if (errors_ == nullptr) throw;
      // Every problem of the file, not only the first; should the second look find none (the file changed
      // between the two reads), the first error still stands: an unopened shard is never silently absent.
      const auto problems = find_safetensors_file_problems(path);
      for (const auto& problem : problems) errors_->push_back(problem.what());
      if (problems.empty()) errors_->push_back(e.what());
    }
  }

  // Joins the shards' tensors into one sorted table; a key in two shards is an error either way, since
  // which copy a loader would take is then arbitrary.
  void link_tensors(Checkpoint& c) {
    std::vector<Checkpoint::TensorRef> all;
    for (const auto& shard : c.shards_) {
      for (const auto& info : shard.tensors()) all.push_back({&shard, &info});
    }
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.info->name < b.info->name; });
    for (const auto& ref : all) {
      if (!c.by_name_.empty() && c.by_name_.back().info->name == ref.info->name) {
        error(CheckpointError(
            Kind::kKeyInTwoShards,
            fmt::format("{}: tensor '{}' is in both {} and {}", c.dir_.string(), ref.info->name,
                        c.by_name_.back().shard->path().filename().string(), ref.shard->path().filename().string())));
        continue;
      }
      c.by_name_.push_back(ref);
    }
  }

  void check_index(Checkpoint& c, const fs::path& index_path) {
    const ShardIndex& index = *c.index_;
    const std::string label = index_path.string();
    for (const auto& ref : c.by_name_) {
      const std::string shard_name = ref.shard->path().filename().string();
      const std::string* mapped = index.file_of(ref.info->name);
      if (mapped == nullptr) {
        if (index.left_out(ref.info->name)) continue;  // its entry's problem is reported already
        error(CheckpointError(Kind::kKeyNotInIndex, fmt::format("{}: shard {} holds tensor '{}', which the index "
                                                                "does not list",
                                                                label, shard_name, ref.info->name)));
      } else if (*mapped != shard_name) {
        error(CheckpointError(Kind::kWrongShard, fmt::format("{}: maps tensor '{}' to {}, but it is in {}", label,
                                                             ref.info->name, *mapped, shard_name)));
      }
    }
    std::map<std::string, const SafetensorsFile*, std::less<>> opened;
    for (const auto& shard : c.shards_) opened.emplace(shard.path().filename().string(), &shard);
    for (const auto& entry : index.entries()) {
      const std::string& file = index.files()[entry.file];
      auto it = opened.find(file);
      if (it == opened.end()) continue;  // missing or broken shard: reported already
      if (it->second->find(entry.name) != nullptr) continue;
      auto ref = std::lower_bound(c.by_name_.begin(), c.by_name_.end(), entry.name,
                                  [](const auto& r, const std::string& n) { return r.info->name < n; });
      if (ref != c.by_name_.end() && ref->info->name == entry.name) continue;  // in another shard: reported above
      error(CheckpointError(Kind::kKeyNotInShard, fmt::format("{}: maps tensor '{}' to {}, which does not hold it",
                                                              label, entry.name, file)));
    }
    if (auto claimed = index.total_size(); claimed && *claimed != c.tensor_bytes()) {
      warn(fmt::format("{}: metadata.total_size is {} but the shards hold {} tensor bytes", label, *claimed,
                       c.tensor_bytes()));
    }
  }

  std::vector<std::string>* errors_;
  std::vector<std::string> warnings_;
};

Checkpoint Checkpoint::open(const fs::path& dir) {
  CheckpointBuilder builder(nullptr);
  Checkpoint c = builder.build(dir);
  c.warnings_ = builder.take_warnings();
  for (const auto& w : c.warnings_) log::warn("{}", w);
  return c;
}

CheckpointInspection inspect_checkpoint_dir(const fs::path& dir) {
  CheckpointInspection out;
  CheckpointBuilder builder(&out.report.errors);
  try {
    Checkpoint c = builder.build(dir);
    if (out.report.ok()) out.checkpoint = std::move(c);
  } catch (const std::exception& e) {
    // Not an input problem we know how to describe (out of memory, a filesystem error mid-walk): still a
    // report, never a crash of the tool asking.
    out.report.errors.push_back(fmt::format("{}: {}", dir.string(), e.what()));
    out.checkpoint.reset();
  }
  out.report.warnings = builder.take_warnings();
  if (out.checkpoint) out.checkpoint->warnings_ = out.report.warnings;
  return out;
}

CheckpointReport validate_checkpoint_dir(const fs::path& dir) { return inspect_checkpoint_dir(dir).report; }

const Checkpoint::TensorRef* Checkpoint::find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [](const TensorRef& r, std::string_view n) { return r.info->name < n; });
  if (it == by_name_.end() || it->info->name != name) return nullptr;
  return &*it;
}

const Checkpoint::TensorRef& Checkpoint::at(std::string_view name) const {
  if (const TensorRef* ref = find(name)) return *ref;
  throw CheckpointError(Kind::kTensorNotFound,
                        fmt::format("{}: no tensor '{}' in the checkpoint", dir_.string(), name));
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& ref : by_name_) names.push_back(ref.info->name);
  return names;
}

uint64_t Checkpoint::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& ref : by_name_) total += ref.info->nbytes();
  return total;
}

Tensor Checkpoint::read_tensor(std::string_view name) const {
  const TensorRef& ref = at(name);
  Tensor tensor(ref.info->dtype, ref.info->shape);
  ref.shard->read(*ref.info, tensor.data());
  return tensor;
}

bool Checkpoint::has_file(std::string_view relative) const {
  if (!is_inside_relative(relative)) return false;
  std::error_code ec;
  return fs::is_regular_file(dir_ / relative, ec);
}

fs::path Checkpoint::file_path(std::string_view relative) const {
  if (!is_inside_relative(relative)) {
    throw CheckpointError(
        Kind::kBadPath, fmt::format("{}: '{}' is not a relative path inside the checkpoint", dir_.string(), relative));
  }
  return dir_ / relative;
}

}  // namespace kimirt::io
