// Helpers for the harness tests: the tiny model spec, XML well-formedness (running kvdiff and
// reading files: tests/test_support.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/scenario/scenario.h"
#include "tests/test_support.h"

namespace kvdiff::testing {

// The model most tests run on: the tiny preset (2 layers, hidden 64), random weights of `seed`.
inline harness::ModelSpec TinyModel(uint64_t seed = 7) {
  harness::ModelSpec model;
  model.preset = "tiny";
  model.seed = seed;
  return model;
}

// A small XML 1.0 well-formedness check (enough for our JUnit files): one root element, tags
// properly nested, attribute values quoted, only the five predefined entities and numeric
// character references, no raw '<' or '&' in text or values. Returns "" or the first problem.
inline std::string XmlProblem(const std::string& xml, std::vector<std::string>* element_names) {
  size_t i = 0;
  std::vector<std::string> stack;
  bool root_seen = false;
  auto check_text = [](const std::string& t) -> std::string {
    for (size_t k = 0; k < t.size(); ++k) {
      if (t[k] == '<') return "raw '<' in text";
      if (t[k] == '&') {
        const size_t semi = t.find(';', k);
        if (semi == std::string::npos) return "unterminated entity";
        const std::string ent = t.substr(k + 1, semi - k - 1);
        const bool ok = ent == "amp" || ent == "lt" || ent == "gt" || ent == "quot" ||
                        ent == "apos" || (ent.size() > 1 && ent[0] == '#');
        if (!ok) return "unknown entity &" + ent + ";";
      }
      const unsigned char c = static_cast<unsigned char>(t[k]);
      if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') return "control character";
    }
    return "";
  };
  if (xml.rfind("<?xml", 0) == 0) {
    i = xml.find("?>");
    if (i == std::string::npos) return "unterminated XML declaration";
    i += 2;
  }
  while (i < xml.size()) {
    const size_t lt = xml.find('<', i);
    const std::string text = xml.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    if (auto p = check_text(text); !p.empty()) return p;
    if (stack.empty() && text.find_first_not_of(" \n\r\t") != std::string::npos)
      return "text outside the root element";
    if (lt == std::string::npos) break;
    const size_t gt = xml.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    const size_t name_end = tag.find_first_of(" \n\t");
    const std::string name = tag.substr(0, name_end);
    if (name.empty()) return "empty tag name";
    if (stack.empty()) {
      if (root_seen) return "a second root element <" + name + ">";
      root_seen = true;
    }
    if (element_names) element_names->push_back(name);
    // Attributes: name="value" pairs.
    size_t k = name_end == std::string::npos ? tag.size() : name_end;
    while (k < tag.size()) {
      while (k < tag.size() && (tag[k] == ' ' || tag[k] == '\n' || tag[k] == '\t')) ++k;
      if (k >= tag.size()) break;
      const size_t eq = tag.find('=', k);
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"')
        return "attribute without a quoted value in <" + name + ">";
      const size_t close = tag.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute value in <" + name + ">";
      if (auto p = check_text(tag.substr(eq + 2, close - eq - 2)); !p.empty()) return p;
      k = close + 1;
    }
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (!root_seen) return "no root element";
  return "";
}

// The value of attribute `name` on the first element `<element ...>`, or "".
inline std::string XmlAttribute(const std::string& xml, const std::string& element,
                                const std::string& name) {
  const size_t at = xml.find("<" + element + " ");
  if (at == std::string::npos) return "";
  const size_t end = xml.find('>', at);
  const size_t a = xml.find(" " + name + "=\"", at);
  if (a == std::string::npos || a > end) return "";
  const size_t v = a + name.size() + 3;
  return xml.substr(v, xml.find('"', v) - v);
}

}  // namespace kvdiff::testing
