// Tokenizer throughput (not a test): single-thread encode of a generated mixed-script text (English
// prose, code, Chinese, Japanese, Korean, Cyrillic, Arabic, Devanagari, Greek, numbers, emoji; >= 10 MB),
// plus the pre-tokenizer split alone (an upper bound for encode) and decode. Figures go to docs/PERF.md.
//
//   kimirt-bench tokenizer -m testdata/tokenizer [--mb 16] [--repeats 3]
//
// There is no hardware ceiling for this CPU-bound, branchy work; the split-only rate is printed as the
// reference instead (encode can be at most that fast).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/timer.h"
#include "kimirt/text/pretokenizer.h"
#include "kimirt/text/tokenizer.h"
#include "bench_registry.h"

namespace {

using kimirt::text::TokenId;

const std::vector<std::string> kEnglish = {
    "the",       "of",        "and",         "to",          "in",           "is",       "that",       "for",
    "it",        "as",        "was",         "with",        "be",           "by",       "on",         "not",
    "he",        "this",      "are",         "or",          "his",          "from",     "at",         "which",
    "but",       "have",      "an",          "had",         "they",         "you",      "were",       "their",
    "one",       "all",       "we",          "can",         "her",          "has",      "there",      "been",
    "if",        "more",      "when",        "will",        "would",        "who",      "so",         "no",
    "model",     "attention", "sequence",    "tokenizer",   "inference",    "latency",  "throughput", "kernel",
    "memory",    "bandwidth", "expert",      "router",      "layer",        "state",    "cache",      "request",
    "server",    "language",  "mathematics", "probability", "distribution", "gradient", "checkpoint", "quantization",
    "It's",      "don't",     "we'll",       "they're",     "you've",       "I'm",      "she'd",      "Kimi",
    "Moonshot",  "Hopper",    "NVIDIA",      "HTTP",        "JSON",         "API",      "GPU",        "CPU",
    "reasoning", "documents", "questions",   "answers",     "because",      "however",  "therefore",  "although",
    "between",   "through",   "during",      "without",     "within",       "against"};
const std::vector<std::string> kChinese = {
    "人工智能", "正在",   "改变", "世界", "我们", "需要", "认真", "思考",   "它的",   "影响", "今天", "天气", "很好",
    "公园",     "散步",   "数学", "科学", "语言", "模型", "推理", "长文本", "注意力", "专家", "路由", "计算", "内存",
    "带宽",     "服务器", "请求", "用户", "问题", "答案", "文档", "阅读",   "理解",   "生成", "训练", "数据"};
const std::vector<std::string> kJapanese = {"東京",     "は",       "日本",     "の",           "首都",     "です",
                                            "ひらがな", "と",       "カタカナ", "も",           "使います", "ラーメン",
                                            "を",       "食べたい", "モデル",   "推論",         "が",       "速い",
                                            "長い",     "文章",     "読みます", "コンピュータ", "する"};
const std::vector<std::string> kKorean = {"한국어", "문장도", "포함합니다", "안녕하세요", "모델",   "추론",    "서버",
                                          "요청",   "사용자", "질문",       "답변",       "문서를", "읽습니다"};
const std::vector<std::string> kCyrillic = {"Привет", "мир",    "Это",   "проверка", "кириллицы", "модель",
                                            "запрос", "сервер", "ответ", "вопрос",   "документ",  "память"};
const std::vector<std::string> kArabic = {"مرحبا", "بالعالم", "هذا", "اختبار", "النموذج", "الخادم", "سؤال", "جواب"};
const std::vector<std::string> kDevanagari = {"नमस्ते", "दुनिया", "यह", "एक", "परीक्षण", "है", "मॉडल", "प्रश्न"};
const std::vector<std::string> kGreek = {"Ελληνικά", "γράμματα", "αβγδε", "ΑΒΓΔΕ", "μοντέλο", "ερώτηση"};
const std::vector<std::string> kEmoji = {"😀", "🙈", "🚀", "👩‍👩‍👧‍👦", "🇯🇵", "🇫🇷", "✨", "🎉", "👍🏽"};
const std::vector<std::string> kCode = {
    "def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;\n",
    "if (!ok) {\n  throw std::runtime_error(\"bad input: \" + name);\n}\n",
    "    const auto it = table.find(key);\n    if (it == table.end()) return std::nullopt;\n",
    "<div class=\"row\"><span id=\"x\">{{ value }}</span></div>\n",
    "$$\\int_0^1 x^2 dx = \\frac{1}{3}$$ and ∑∏√∞≈≠≤≥\n"};

class TextGenerator {
 public:
  explicit TextGenerator(std::uint64_t seed) : rng_(seed) {}

  std::string make(size_t bytes) {
    std::string text;
    text.reserve(bytes + 4096);
    while (text.size() < bytes) paragraph(text);
    return text;
  }

 private:
  size_t pick(size_t n) {
    // Roughly Zipfian: small indices are much more common, as words are in real text.
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double x = u(rng_);
    return std::min(n - 1, static_cast<size_t>(static_cast<double>(n) * x * x * x));
  }
  int roll(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  void words(std::string& out, const std::vector<std::string>& list, int count, const char* sep, const char* end) {
    for (int i = 0; i < count; ++i) {
      if (i > 0) out += sep;
      out += list[pick(list.size())];
      if (roll(12) == 0) out += ",";
    }
    out += end;
  }

  void number(std::string& out) {
    switch (roll(4)) {
      case 0:
        out += std::to_string(roll(100000));
        break;
      case 1:
        out += std::to_string(roll(1000)) + "." + std::to_string(roll(100000));
        break;
      case 2:
        out += "20" + std::to_string(10 + roll(20)) + "-" + std::to_string(1 + roll(12)) + "-" +
               std::to_string(1 + roll(28));
        break;
      default:
        out += std::to_string(roll(1000)) + "," + std::to_string(100 + roll(900));
        break;
    }
  }

  void paragraph(std::string& out) {
    const int kind = roll(100);
    if (kind < 36) {
      for (int s = 0, n = 2 + roll(5); s < n; ++s) {
        std::string sentence;
        words(sentence, kEnglish, 6 + roll(14), " ", "");
        sentence[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(sentence[0])));
        if (roll(3) == 0) {
          sentence += " ";
          number(sentence);
        }
        out += sentence + (roll(5) == 0 ? "? " : ". ");
      }
    } else if (kind < 50) {
      out += kCode[pick(kCode.size())];
    } else if (kind < 64) {
      words(out, kChinese, 8 + roll(24), roll(6) == 0 ? "，" : "", "。");
    } else if (kind < 72) {
      words(out, kJapanese, 6 + roll(16), "", "。");
    } else if (kind < 77) {
      words(out, kKorean, 4 + roll(10), " ", ". ");
    } else if (kind < 83) {
      words(out, kCyrillic, 5 + roll(12), " ", ". ");
    } else if (kind < 87) {
      words(out, kArabic, 4 + roll(10), " ", ". ");
    } else if (kind < 90) {
      words(out, kDevanagari, 4 + roll(10), " ", "। ");
    } else if (kind < 93) {
      words(out, kGreek, 4 + roll(10), " ", ". ");
    } else if (kind < 96) {
      words(out, kEmoji, 1 + roll(6), roll(2) ? " " : "", " ");
    } else {
      for (int i = 0, n = 3 + roll(8); i < n; ++i) {
        number(out);
        out += roll(4) == 0 ? "\t" : " ";
      }
    }
    out += roll(4) == 0 ? "\n\n" : "\n";
  }

  std::mt19937_64 rng_;
};

// Wall time, and the CPU time of this thread: on a shared machine (CI, other builds) the second is the
// steadier figure; on an idle one they agree.
struct Seconds {
  double wall;
  double cpu;
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

template <typename Fn>
Seconds best_seconds(int repeats, Fn&& fn) {
  Seconds best{1e30, 1e30};
  for (int r = 0; r < repeats; ++r) {
    const double cpu_start = thread_cpu_seconds();
    kimirt::Timer timer;
    fn();
    best.wall = std::min(best.wall, timer.seconds());
    best.cpu = std::min(best.cpu, thread_cpu_seconds() - cpu_start);
  }
  return best;
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t group = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(group >> 18) & 63];
    out += kAlphabet[(group >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(group >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[group & 63] : '=';
  }
  return out;
}

// Load time at the released size: a synthetic tiktoken.model with K3's 163,584 ranks (all single bytes,
// then random unique tokens of 2..16 bytes) and a tokenizer_config.json naming the 256 special ids.
double k3_sized_load_seconds(int repeats) {
  constexpr int kRanks = 163584;
  const auto dir = std::filesystem::temp_directory_path() / "kimirt_bench_k3_vocab";
  std::filesystem::create_directories(dir);
  {
    std::mt19937_64 rng(3);
    std::unordered_set<std::string> seen;
    std::string model;
    for (int b = 0; b < 256; ++b) {
      const std::string token(1, static_cast<char>(b));
      seen.insert(token);
      model += base64(token) + " " + std::to_string(b) + "\n";
    }
    for (int rank = 256; rank < kRanks;) {
      std::string token(2 + rng() % 15, ' ');
      for (auto& c : token) c = static_cast<char>(rng() % 256);
      if (!seen.insert(token).second) continue;
      model += base64(token) + " " + std::to_string(rank++) + "\n";
    }
    std::ofstream(dir / "tiktoken.model") << model;
    std::string config = "{\"added_tokens_decoder\": {";
    for (int i = 0; i < 256; ++i) {
      config +=
          (i ? ", \"" : "\"") + std::to_string(kRanks + i) + "\": {\"content\": \"<|t" + std::to_string(i) + "|>\"}";
    }
    config += "}, \"bos_token\": \"<|t0|>\"}";
    std::ofstream(dir / "tokenizer_config.json") << config;
  }
  const double seconds = best_seconds(repeats, [&] { (void)kimirt::text::Tokenizer::load(dir); }).wall;
  std::filesystem::remove_all(dir);
  return seconds;
}

}  // namespace

int run_tokenizer_bench(int argc, char** argv) {
  CLI::App app{"kimirt tokenizer benchmark: single-thread encode throughput on mixed-script text",
               "kimirt-bench tokenizer"};
  std::string model_dir;
  double megabytes = 16.0;
  int repeats = 3;
  app.add_option("-m,--model", model_dir, "directory with tiktoken.model and tokenizer_config.json")->required();
  app.add_option("--mb", megabytes, "size of the generated text in MB (>= 10 for the logged figure)");
  app.add_option("--repeats", repeats, "timed runs; the best is reported")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const kimirt::Timer load_timer;
    const auto tokenizer = kimirt::text::Tokenizer::load(model_dir);
    const double load_s = load_timer.seconds();
    const std::string text = TextGenerator(20261129).make(static_cast<size_t>(megabytes * 1e6));
    const double mb = static_cast<double>(text.size()) / 1e6;
    const auto ascii = std::count_if(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; });

    const kimirt::text::Pretokenizer pretokenizer;
    std::vector<kimirt::text::PieceSpan> spans;
    const Seconds split_s = best_seconds(repeats, [&] {
      spans.clear();
      pretokenizer.split(text, spans);
    });
    std::vector<TokenId> ids;
    tokenizer.encode_append(text, false, ids);  // warm-up: fills the piece cache as a server would be
    const Seconds encode_s = best_seconds(repeats, [&] {
      ids.clear();
      tokenizer.encode_append(text, false, ids);
    });
    std::string decoded;
    const Seconds decode_s = best_seconds(repeats, [&] { decoded = tokenizer.decode(ids); });
    KIMIRT_CHECK(decoded == text, "decode did not give the benchmark text back");

    const double tokens = static_cast<double>(ids.size());
    std::printf("tokenizer: %s (%d ranks + %d special), loaded in %.1f ms, PCRE2 JIT %s\n", model_dir.c_str(),
                tokenizer.num_ranks(), tokenizer.vocab_size() - tokenizer.num_ranks(), load_s * 1e3,
                tokenizer.jit_enabled() ? "on" : "off");
    std::printf("text: %.2f MB mixed-script, %.0f%% ASCII bytes, %zu pieces, %zu tokens (%.2f bytes/token)\n", mb,
                100.0 * static_cast<double>(ascii) / static_cast<double>(text.size()), spans.size(), ids.size(),
                static_cast<double>(text.size()) / tokens);
    std::printf("%-22s %12s %12s %14s\n", "single thread, best of", "MB/s (wall)", "MB/s (cpu)", "Mtokens/s (cpu)");
    const auto row = [&](const char* name, Seconds s, bool with_tokens) {
      std::printf("%-22s %12.1f %12.1f", name, mb / s.wall, mb / s.cpu);
      if (with_tokens) std::printf(" %14.2f", tokens / s.cpu / 1e6);
      std::printf("\n");
    };
    row("split only (ceiling)", split_s, false);
    row("encode", encode_s, true);
    row("decode", decode_s, true);
    std::printf("encode / split-only: %.2f\n", split_s.cpu / encode_s.cpu);
    std::printf("load of a K3-sized vocabulary (163,584 ranks + 256 special): %.1f ms\n",
                k3_sized_load_seconds(repeats) * 1e3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimirt-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

namespace {
const kimirt::bench::RegisterSuite kTokenizerSuite("tokenizer", "single-thread encode/decode throughput (MB/s)",
                                                   run_tokenizer_bench);
}  // namespace
