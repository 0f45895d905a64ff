// Every relative link in the repository's Markdown (README.md, docs/, the examples' READMEs)
// names a file that exists and, with a #fragment into a Markdown file, a heading it has: sections
// are renamed and renumbered as the manual grows, and a link that leads nowhere is a dead end for
// the newcomer who followed it. Web links are not followed (no network in tests).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace {

namespace fs = std::filesystem;

struct Line {
  int number;
  std::string text;
};

// The lines outside fenced code blocks (``` or ~~~), where Markdown reads links and headings.
std::vector<Line> ProseLines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<Line> lines;
  std::string text, fence;
  for (int number = 1; std::getline(in, text); ++number) {
    const size_t indent = text.find_first_not_of(' ');
    const std::string trimmed = indent == std::string::npos ? "" : text.substr(indent);
    if (fence.empty() && (trimmed.rfind("```", 0) == 0 || trimmed.rfind("~~~", 0) == 0)) {
      fence = trimmed.substr(0, 3);
    } else if (!fence.empty()) {
      if (trimmed.rfind(fence, 0) == 0) fence.clear();
    } else {
      lines.push_back({number, text});
    }
  }
  return lines;
}

// GitHub's anchor of a heading: lower case, every character but letters, digits, '-', '_' and
// spaces dropped (so `code` loses its backquotes), spaces made '-'; a repeated anchor gets -1, -2.
std::set<std::string> Anchors(const fs::path& file) {
  static const std::regex heading(R"(^#{1,6}\s+(.*?)\s*#*\s*$)");
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  for (const Line& line : ProseLines(file)) {
    std::smatch m;
    if (!std::regex_match(line.text, m, heading)) continue;
    std::string anchor;
    for (const char c : m[1].str()) {
      const auto u = static_cast<unsigned char>(c);
      if (std::isalnum(u) || c == '-' || c == '_' || u >= 0x80) {
        anchor += static_cast<char>(std::tolower(u));
      } else if (c == ' ') {
        anchor += '-';
      }
    }
    const int repeats = seen[anchor]++;
    anchors.insert(repeats == 0 ? anchor : anchor + "-" + std::to_string(repeats));
  }
  return anchors;
}

// The repository's Markdown files, build trees, hidden folders and fetched packages left out.
std::vector<fs::path> MarkdownFiles(const fs::path& root) {
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const fs::path& path = it->path();
    const std::string name = path.filename().string();
    if (it->is_directory() && (name[0] == '.' || name == "node_modules" || name == "target" ||
                               fs::exists(path / "CMakeCache.txt"))) {
      it.disable_recursion_pending();
    } else if (it->is_regular_file() && path.extension() == ".md") {
      files.push_back(path);
    }
  }
  return files;
}

// "file:line: link: what is wrong" for every relative link of `file` that leads nowhere.
std::vector<std::string> DeadLinks(const fs::path& file, const fs::path& root) {
  static const std::regex code_span("`[^`]*`");
  static const std::regex link(R"(\]\(([^)\s]+)\))");
  static const std::regex scheme("^[a-zA-Z][a-zA-Z0-9+.-]*:");
  std::vector<std::string> dead;
  for (const Line& line : ProseLines(file)) {
    const std::string prose = std::regex_replace(line.text, code_span, "");
    for (auto m = std::sregex_iterator(prose.begin(), prose.end(), link);
         m != std::sregex_iterator(); ++m) {
      const std::string target = (*m)[1];
      if (std::regex_search(target, scheme)) continue;  // https:, mailto:
      const size_t hash = target.find('#');
      const std::string path = target.substr(0, hash);
      const fs::path linked = path.empty() ? file : file.parent_path() / path;
      const std::string where = fs::relative(file, root).string() + ":" +
                                std::to_string(line.number) + ": (" + target + "): ";
      if (!fs::exists(linked)) {
        dead.push_back(where + "no such file");
      } else if (hash != std::string::npos && linked.extension() == ".md" &&
                 Anchors(linked).count(target.substr(hash + 1)) == 0) {
        dead.push_back(where + "no heading has that anchor in " +
                       fs::relative(linked, root).string());
      }
    }
  }
  return dead;
}

TEST(DocsLinks, EveryRelativeLinkLeadsToAFileAndAHeading) {
  const fs::path root = KVDIFF_SOURCE_DIR;
  const std::vector<fs::path> files = MarkdownFiles(root);
  ASSERT_GE(files.size(), 10u) << "the Markdown of " << root << " was not found";
  int links = 0;
  std::vector<std::string> dead;
  for (const fs::path& file : files) {
    for (const std::string& d : DeadLinks(file, root)) dead.push_back(d);
    for (const Line& line : ProseLines(file)) links += line.text.find("](") != std::string::npos;
  }
  EXPECT_GE(links, 100) << "fewer lines with links than the manual has: is the parser broken?";
  EXPECT_THAT(dead, ::testing::IsEmpty());
}

TEST(DocsLinks, AnchorsAreGitHubs) {
  const kvdiff::testing::TempDir dir;
  const fs::path file = dir / "headings.md";
  std::ofstream(file) << "# Campaigns: `kvdiff check`\n## Every core: `--jobs`\n```\n# not one\n"
                         "```\n## 7. Inside kvdiff's build\n## Every core: `--jobs`\n";
  EXPECT_EQ(Anchors(file),
            (std::set<std::string>{"campaigns-kvdiff-check", "every-core---jobs",
                                   "7-inside-kvdiffs-build", "every-core---jobs-1"}));
}

}  // namespace
