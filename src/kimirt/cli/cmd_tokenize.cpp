// `kimirt tokenize` and `kimirt detokenize`: the tokenizer of a model directory on the command line, for
// checking prompts and ids by hand (text on stdin -> JSON array of ids, and back).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cli/command.h"
#include "kimirt/cli/flag_checks.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::cli {
namespace {

std::string read_stdin() {
  std::string data;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), stdin)) > 0) data.append(buffer, got);
  KIMIRT_CHECK(!std::ferror(stdin), "cannot read standard input");
  return data;
}

struct TokenizeOptions {
  std::string model_dir;
  bool special = false;
};

const RegisterCommand kTokenize("tokenize", 60, [](CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Encode the text on stdin; print its ids as a JSON array");
  cmd->add_option("-m,--model", options->model_dir, "model directory (tiktoken.model, tokenizer_config.json)")
      ->required()
      ->check(not_empty());
  cmd->add_flag("--special", options->special,
                "encode special-token text such as <|im_end|> as its single id (default: as plain text)");
  cmd->footer("The text is taken byte for byte, a final newline included (use printf or echo -n to omit it).");
  cmd->callback([options] {
    const auto tokenizer = text::Tokenizer::load(options->model_dir);
    const std::string input = read_stdin();
    const auto ids = with_context("standard input", [&] { return tokenizer.encode(input, options->special); });
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
});

struct DetokenizeOptions {
  std::string model_dir;
  bool skip_special = false;
};

const RegisterCommand kDetokenize("detokenize", 61, [](CLI::App& app) {
  auto options = std::make_shared<DetokenizeOptions>();
  auto* cmd = app.add_subcommand("detokenize", "Decode a JSON array of ids on stdin; print the text");
  cmd->add_option("-m,--model", options->model_dir, "model directory (tiktoken.model, tokenizer_config.json)")
      ->required()
      ->check(not_empty());
  cmd->add_flag("--skip-special", options->skip_special, "leave special tokens out of the text");
  cmd->footer(
      "The bytes of the ids are written as they are (no newline is added; a character cut between ids "
      "is written cut).");
  cmd->callback([options] {
    const auto tokenizer = text::Tokenizer::load(options->model_dir);
    const std::string input = read_stdin();
    nlohmann::json array;
    try {
      array = nlohmann::json::parse(input);
    } catch (const nlohmann::json::parse_error& e) {
      fail("standard input: not valid JSON: {}", e.what());
    }
    KIMIRT_CHECK(array.is_array(), "standard input: expected a JSON array of token ids");
    std::vector<text::TokenId> ids;
    ids.reserve(array.size());
    for (size_t i = 0; i < array.size(); ++i) {
      const auto& v = array[i];
      KIMIRT_CHECK(
          v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() < tokenizer.vocab_size(),
          "standard input: element {} ({}) is not a token id of this vocabulary (0..{})", i, v.dump(),
          tokenizer.vocab_size() - 1);
      ids.push_back(static_cast<text::TokenId>(v.get<std::int64_t>()));
    }
    const std::string out = tokenizer.decode(ids, options->skip_special);
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
});

}  // namespace
}  // namespace kimirt::cli
