// The one JSON reader (format::ParseJsonDocument) and the one input-file gate
// (format/input_file.h).
#include "format/json_document.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "format/error.h"
#include "format/input_file.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string ErrorOf(const std::string& text) {
  try {
    ParseJsonDocument(text, "doc");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonDocument, AcceptsTheDeepestAllowedNesting) {
  EXPECT_EQ(ParseJsonDocument(Nested(kMaxJsonDepth), "doc").size(), 1u);
  EXPECT_EQ(ParseJsonDocument("{\"a\": " + Nested(kMaxJsonDepth - 1) + "}", "doc").size(), 1u);
}

TEST(JsonDocument, RefusesOneLevelMoreWithoutRecursing) {
  EXPECT_EQ(ErrorOf(Nested(kMaxJsonDepth + 1)),
            "doc: invalid JSON: nesting deeper than 64 levels (arrays and objects) at byte 64");
  // A million levels: the pre-scan is linear and the parser never sees it.
  EXPECT_THAT(ErrorOf(Nested(1000000)), HasSubstr("nesting deeper than 64"));
  EXPECT_THAT(ErrorOf("{\"x\":" + std::string(100000, '{')), HasSubstr("nesting deeper than 64"));
}

TEST(JsonDocument, BracketsInStringsDoNotCount) {
  const std::string text = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  EXPECT_EQ(ParseJsonDocument(text, "doc").size(), 1u);
}

TEST(JsonDocument, RefusesDuplicateKeysAtAnyDepth) {
  EXPECT_EQ(ErrorOf(R"({"a": 1, "a": 2})"), "doc: invalid JSON: duplicate key \"a\" in an object");
  EXPECT_THAT(ErrorOf(R"({"a": [{"b": 1, "c": {"b": 2}, "b": 3}]})"),
              HasSubstr("duplicate key \"b\""));
  // The same key in sibling objects is fine.
  EXPECT_NO_THROW(ParseJsonDocument(R"([{"a": 1}, {"a": 2}, {"b": {"a": 3}}])", "doc"));
}

TEST(JsonDocument, NumbersOutOfRangeAndSyntaxErrorsReadAsInputErrors) {
  EXPECT_EQ(ErrorOf(R"({"abs": 1e400})"), "doc: invalid JSON: number overflow parsing '1e400'");
  EXPECT_THAT(ErrorOf("{\"a\":"), StartsWith("doc: invalid JSON: parse error at line 1, column 6"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("invalid JSON"));
}

TEST(JsonSnippet, NeverSerializesMoreThanItShows) {
  json big = json::array();
  for (int i = 0; i < 1000000; ++i) big.push_back(i);
  const std::string s = JsonSnippet(big);
  EXPECT_LE(s.size(), 63u);
  EXPECT_THAT(s, StartsWith("[0,1,2,3"));
  EXPECT_EQ(JsonSnippet(json{{"a", 1}}), "{\"a\":1}");
  EXPECT_EQ(JsonSnippet(json(std::string(100, 'x'))).size(), 63u);
}

TEST(JsonSnippet, InvalidUtf8IsReplacedNotThrown) {
  EXPECT_EQ(JsonSnippet(json(std::string("a\xff"))), "\"a\xEF\xBF\xBD\"");
}

class InputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvdiff-input-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

std::string ReadError(const std::filesystem::path& p, uint64_t max = kMaxTextFileBytes) {
  try {
    ReadInputFile(p, "scenario", max);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST_F(InputFileTest, ReadsARegularFile) {
  std::ofstream(dir_ / "a.json") << "{}";
  EXPECT_EQ(ReadInputFile(dir_ / "a.json", "scenario"), "{}");
}

TEST_F(InputFileTest, RefusesWhatIsNotARegularFileNamingIt) {
  EXPECT_EQ(ReadError(dir_),
            "cannot read scenario " + dir_.string() + ": it is a directory, expected a file");
  EXPECT_THAT(ReadError("/dev/zero"), HasSubstr("/dev/zero: not a regular file"));
  EXPECT_THAT(ReadError(dir_ / "absent"), HasSubstr("cannot open scenario"));
}

TEST_F(InputFileTest, RefusesAFileOverTheBound) {
  std::ofstream(dir_ / "a.json") << "0123456789";
  EXPECT_THAT(ReadError(dir_ / "a.json", 9), HasSubstr("10 bytes, more than the 9 accepted"));
  EXPECT_EQ(ReadInputFile(dir_ / "a.json", "scenario", 10), "0123456789");
}

}  // namespace
}  // namespace kvdiff::format
