// The chat template interpreter's parts, shared by its files and by nothing else: the limits,
// values, tokens, syntax tree, and the lexer, parser and renderer entry points. The public
// interface is format/chat_template.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/chat_template.h"

namespace kvdiff::format {
namespace chat_template_detail {

// Templates come from model files, so what they may ask for is bounded: how deeply they nest (the
// parser and the renderer recurse on it, so "((((...))))", "- - - x" or "1+1+...+1" a million
// deep would overflow the stack), how long rendering runs (nested loops multiply), how large a
// string or a list may grow ({% set x = x ~ x %} doubles) and how much text the expressions pass
// around in all (each string an expression yields is a copy). Real templates use a few levels, a
// few thousand steps and a prompt's worth of text; 4 MiB is a prompt longer than any context.
constexpr int kMaxNesting = 100;
constexpr int64_t kMaxRenderSteps = 1'000'000;
constexpr size_t kMaxTextBytes = size_t{4} << 20;
constexpr size_t kMaxRenderBytes = size_t{128} << 20;
constexpr size_t kMaxListItems = size_t{1} << 20;
// The work one step may hide, in all: list items created (`+`, slices, items()) and list items,
// dict keys and text bytes an `in` looks through. A 741-byte template doubling a list 20 times
// and then asking `2 in l` in a loop ran on without end; eight `l + l` of it took 820 MB. (A
// list item is about 100 bytes: 2M items are ~200 MB.)
constexpr int64_t kMaxRenderListItems = int64_t{2} << 20;
constexpr int64_t kMaxRenderScanned = int64_t{64} << 20;

// ---- values -----------------------------------------------------------------------------------

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Jinja's dicts

struct Value {
  enum Kind { kUndefined, kNone, kBool, kInt, kString, kList, kDict } kind = kUndefined;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  int depth = 0;  // of the lists and dicts nested in this one; 0 for a scalar

  static Value Bool(bool v) {
    Value x;
    x.kind = kBool;
    x.b = v;
    return x;
  }
  static Value Int(int64_t v) {
    Value x;
    x.kind = kInt;
    x.i = v;
    return x;
  }
  static Value Str(std::string v) {
    Value x;
    x.kind = kString;
    x.s = std::move(v);
    return x;
  }
  static Value None() {
    Value x;
    x.kind = kNone;
    return x;
  }
  static Value MakeList(List v) {
    Value x;
    x.kind = kList;
    for (const Value& item : v) x.depth = std::max(x.depth, item.depth);
    ++x.depth;
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value MakeDict(Dict v) {
    Value x;
    x.kind = kDict;
    for (const auto& item : v) x.depth = std::max(x.depth, item.second.depth);
    ++x.depth;
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
};

const char* KindName(const Value& v);
bool Truthy(const Value& v);
bool Equal(const Value& a, const Value& b);

// ---- UTF-8 helpers (Python's str semantics: code points, str.isspace) ---------------------------

// Where each code point of `s` starts, then s.size(): code point k is s[at[k], at[k + 1]).
std::vector<size_t> CodePointStarts(const std::string& s);
bool IsPySpace(const std::string& ch);
std::string Strip(const std::string& s, bool left, bool right);
bool IsAscii(const std::string& s);

// ---- lexer ------------------------------------------------------------------------------------

struct Tok {
  enum Kind {
    kText,
    kOpenExpr,
    kOpenStmt,
    kCloseExpr,
    kCloseStmt,
    kName,
    kString,
    kInt,
    kOp,
    kEnd
  };
  Kind kind;
  std::string text;
  int line;
};

// The template's tokens: text, {{ }} and {% %} delimiters, names, strings, ints, operators.
std::vector<Tok> Lex(const std::string& source);

// ---- syntax tree ------------------------------------------------------------------------------

struct Expr {
  enum Kind {
    kLiteral,
    kVar,
    kMember,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kTernary,
    kListLit
  } kind;
  Value literal;     // kLiteral
  std::string name;  // kVar, kFilter, kTest; kMember: "." for .attr, "[]" for [key]
  std::string op;    // kUnary, kBinary; kTest: "not" when negated
  std::vector<std::shared_ptr<Expr>>
      kids;  // operands; kSlice: object, start, stop, step (null = none)
  int line = 0;
  int depth = 1;  // of the tree below and including this node
};
using ExprPtr = std::shared_ptr<Expr>;

}  // namespace chat_template_detail

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet } kind;
  std::string text;                    // kText; kFor, kSet: the variable
  chat_template_detail::ExprPtr expr;  // kOutput, kIf (condition), kFor (iterable), kSet (value)
  std::vector<std::shared_ptr<Node>> body, orelse;
  int line = 0;
};

namespace chat_template_detail {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<Node>;

// The template's statements; InputError naming the construct and its line.
std::vector<NodePtr> ParseTemplate(std::vector<Tok> tokens);
// The text the statements render to with `globals` as the variables.
std::string RenderTemplate(const std::vector<NodePtr>& nodes, std::map<std::string, Value> globals);

}  // namespace chat_template_detail
}  // namespace kvdiff::format
