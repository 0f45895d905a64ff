// `kvdiff repro`'s text: the header, one block per experiment, and the source document's table.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/repro/repro.h"

namespace kvdiff::harness {
namespace {

std::string Quote(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string Ids(const Tokens& tokens) { return fmt::format("[{}]", fmt::join(tokens, " ")); }

// Pads to a display width counted in UTF-8 characters, so text columns line up.
std::string Pad(const std::string& s, size_t width) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  return chars >= width ? s : s + std::string(width - chars, ' ');
}
size_t Width(const std::string& s) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  return chars;
}

}  // namespace

std::string VsCorrect(const ReproLine& line) {
  if (!line.error.empty()) return "error";
  if (line.departs_at == 0) return "= " + line.baseline;
  return fmt::format("departs from {} at token {}", line.baseline, line.departs_at);
}

std::string FormatLineOutput(const ReproLine& line, const format::Tokenizer* tokenizer) {
  if (!line.error.empty()) return "Error: " + line.error;
  if (!tokenizer) return Ids(line.generated);
  return Quote(tokenizer->DecodeAll(line.generated, line.prompt.back()));
}

std::string FormatReproHeader(const std::string& model_source, const format::LlamaConfig& config,
                              const ReproPrompts& p, const format::Tokenizer* tokenizer) {
  auto prompt = [&](const Tokens& t, const std::optional<std::string>& text) {
    std::string shown = Ids(t);
    if (text) {
      shown = Quote(*text) + " = " + shown;
    } else if (tokenizer) {
      shown += " = " + Quote(tokenizer->DecodeAll(t, -1));
    }
    return fmt::format("{} ({} token{})", shown, t.size(), t.size() == 1 ? "" : "s");
  };
  std::string out =
      fmt::format("model: {} ({} layers, {} heads, vocab {})\n", model_source,
                  config.num_hidden_layers, config.num_attention_heads, config.vocab_size);
  out += fmt::format("first prompt:            {}\n", prompt(p.first, p.first_text));
  out += fmt::format("second prompt:           {}\n", prompt(p.second, p.second_text));
  out += fmt::format("one-token second prompt: {}\n", prompt(p.second1, std::nullopt));
  out += fmt::format("each conversation: the prompt, then {} greedy tokens\n", p.n);
  return out;
}

std::string FormatExperiment(const ExperimentResult& r, const format::Tokenizer* tokenizer) {
  std::string out =
      fmt::format("{}: {}\n", ExperimentName(r.experiment), ExperimentWhat(r.experiment));
  if (!r.skipped.empty()) return out + fmt::format("  skipped: {}\n", r.skipped);
  size_t w_vs = 0;
  for (const ReproLine& line : r.lines) w_vs = std::max(w_vs, Width(VsCorrect(line)));
  for (const ReproLine& line : r.lines) {
    out += fmt::format("  {:<7} {}  {}\n", line.conversation, Pad(VsCorrect(line), w_vs),
                       FormatLineOutput(line, tokenizer));
  }
  out += fmt::format("  source document: {}\n", ExperimentDocumented(r.experiment));
  out += fmt::format("  observed:        {}\n", r.observed);
  out += fmt::format("  as documented:   {}\n", r.as_documented ? "yes" : "NO");
  return out;
}

std::string FormatReproTable(const std::vector<ExperimentResult>& results,
                             const format::Tokenizer* tokenizer) {
  // The document's table: ok and pos0 show the first conversation, the others the second.
  struct Row {
    std::string name, conversation, output, vs;
  };
  std::vector<Row> rows;
  for (const auto& r : results) {
    Row row{ExperimentName(r.experiment), "", "", ""};
    if (!r.skipped.empty()) {
      row.output = "(skipped)";
    } else {
      const bool show_first = r.experiment == Experiment::kOk || r.experiment == Experiment::kPos0;
      const ReproLine& line = r.lines.at(show_first ? 0 : 1);
      row.conversation = line.conversation;
      row.output = FormatLineOutput(line, tokenizer);
      row.vs = VsCorrect(line);
    }
    rows.push_back(row);
  }
  size_t w_name = 10, w_conv = 12, w_out = 9;
  for (const auto& row : rows) {
    w_name = std::max(w_name, Width(row.name));
    w_out = std::max(w_out, Width(row.output));
  }
  std::string out = Pad("experiment", w_name) + "  " + Pad("conversation", w_conv) + "  " +
                    Pad("generated", w_out) + "  vs correct\n";
  for (const auto& row : rows) {
    out += Pad(row.name, w_name) + "  " + Pad(row.conversation, w_conv) + "  " +
           Pad(row.output, w_out) + "  " + row.vs + "\n";
  }

  out += "\n";
  // A skip's reason, short: the part before its first explanation.
  auto skipped_short = [](const std::string& why) {
    return "skipped: " + why.substr(0, std::min(why.find(':'), why.find(" (")));
  };
  size_t w_doc = 21, w_obs = 8;
  for (const auto& r : results) {
    w_doc = std::max(w_doc, Width(ExperimentDocumented(r.experiment)));
    w_obs = std::max(w_obs, Width(r.skipped.empty() ? r.observed : skipped_short(r.skipped)));
  }
  out += Pad("experiment", w_name) + "  " + Pad("source document says", w_doc) + "  " +
         Pad("observed", w_obs) + "  as documented\n";
  for (const auto& r : results) {
    const std::string observed = r.skipped.empty() ? r.observed : skipped_short(r.skipped);
    const std::string verdict = !r.skipped.empty() ? "-" : r.as_documented ? "yes" : "NO";
    out += Pad(ExperimentName(r.experiment), w_name) + "  " +
           Pad(ExperimentDocumented(r.experiment), w_doc) + "  " + Pad(observed, w_obs) + "  " +
           verdict + "\n";
  }
  return out;
}

}  // namespace kvdiff::harness
