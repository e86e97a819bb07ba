// `kimirt inspect DIR [--json] [--check-values]`: validates a whole checkpoint directory and summarizes it;
// --check-values also reads every float tensor for NaN and infinite values. Exits 1 when the checkpoint is
// invalid, after listing every problem found.
#include <cstdio>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/cli/checkpoint_summary.h"
#include "kimirt/cli/command.h"
#include "kimirt/cli/device_summary.h"
#include "kimirt/cli/flag_checks.h"

namespace kimirt::cli {
namespace {

struct InspectArgs {
  std::string dir;
  bool json = false;
  bool device = false;
  bool check_values = false;
  std::string gpu_memory;
};

const RegisterCommand kInspect("inspect", 10, [](CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "Validate a checkpoint directory and print a summary");
  cmd->add_option("dir", args->dir, "checkpoint directory (config.json, *.safetensors, index)")->required();
  cmd->add_flag("--json", args->json, "print the summary as JSON");
  cmd->add_flag("--device", args->device, "also describe the GPU and the memory plan");
  cmd->add_flag("--check-values", args->check_values,
                "also read every float tensor and count its NaN and infinite values (reads the whole checkpoint)");
  cmd->add_option("--gpu-memory", args->gpu_memory,
                  "with --device: how much of each GPU kimirt may take, a share of its memory (90%) or a size "
                  "(120GiB); default 90%")
      ->check(not_empty());  // "" read as "not given", the default taken without a word
  cmd->callback([args] {
    check_gpu_memory(args->gpu_memory);
    KIMIRT_CHECK(args->gpu_memory.empty() || args->device, "--gpu-memory {} plans the GPU's memory: it needs --device",
                 args->gpu_memory);
    const auto summary = summarize_checkpoint(args->dir, args->check_values);
    if (args->json) {
      auto j = summary.to_json();
      if (args->device) j["device"] = device_summary_json(summary.config, summary.schema.get(), args->gpu_memory);
      // Replacing bytes that are not UTF-8 (a directory's name may hold any): the JSON still comes out.
      std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::fputs(summary.to_text().c_str(), stdout);
      if (args->device)
        std::fputs(device_summary_text(summary.config, summary.schema.get(), args->gpu_memory).c_str(), stdout);
    }
    set_exit_code(summary.ok() ? 0 : 1);
  });
});

}  // namespace
}  // namespace kimirt::cli
