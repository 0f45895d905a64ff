// Text an engine wrote (its name, version, cache type, error messages) as kvdiff prints it: on one
// line, every control character escaped ("\n", "\x1b"), at most kMaxEngineTextChars characters
// with the rest counted. An engine under test may be broken or hostile; its words go into kvdiff's
// report, and they must not forge a line of it ("PASS: ...") nor drive the terminal.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>

namespace kvdiff::engines {

inline constexpr size_t kMaxEngineTextChars = 4096;

inline std::string EngineText(std::string_view text) {
  std::string out;
  const size_t shown = std::min(text.size(), kMaxEngineTextChars);
  out.reserve(shown);
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);  // printable ASCII, and UTF-8's bytes as they are
    }
  }
  if (shown < text.size()) out += fmt::format("... ({} bytes in all)", text.size());
  return out;
}

}  // namespace kvdiff::engines
