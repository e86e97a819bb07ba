#include "kimirt/cli/default_model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/model/tiny_checkpoint.h"
#include "kimirt/text/default_tokenizer.h"

namespace kimirt::cli {

namespace fs = std::filesystem;

model::ModelConfig config_for_default_tokenizer(model::ModelFamily family) {
  model::TinyDims dims;
  dims.vocab = text::default_tokenizer_vocab_size();
  // tiny_config follows the release's pattern for special ids (bos = vocab - 256, eos = bos + 2), which is
  // where the built-in tokenizer has [BOS] and <|end_of_msg|>.
  return model::tiny_config(family, dims);
}

fs::path default_model_dir() {
  constexpr const char* kName = "default-k3-v1";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "kimirt" / kName;
  const char* home = std::getenv("HOME");
  KIMIRT_CHECK(home && *home, "neither XDG_CACHE_HOME nor HOME is set: pass the model directory with -m");
  return fs::path(home) / ".cache" / "kimirt" / kName;
}

fs::path ensure_default_model() {
  const fs::path dir = default_model_dir();
  if (fs::is_regular_file(dir / "config.json")) return dir;
  fs::create_directories(dir.parent_path());
  std::fprintf(stderr, "kimirt: generating the default model (a small random Kimi K3) into %s\n", dir.c_str());
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  try {
    model::write_tiny_checkpoint(tmp, config_for_default_tokenizer(model::ModelFamily::kKimiK3));
    text::write_default_tokenizer(tmp);
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    // Another process may have won the race: its model is as good as ours.
    if (ec && !fs::is_regular_file(dir / "config.json")) {
      fail("cannot move the default model to {}: {}", dir.string(), ec.message());
    }
  } catch (...) {
    fs::remove_all(tmp);
    throw;
  }
  fs::remove_all(tmp);
  return dir;
}

}  // namespace kimirt::cli
