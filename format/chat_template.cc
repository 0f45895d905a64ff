#include "format/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"
#include "format/tokenizer.h"

namespace kvdiff::format {
namespace {

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

const char* KindName(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "undefined";
    case Value::kNone:
      return "none";
    case Value::kBool:
      return "boolean";
    case Value::kInt:
      return "integer";
    case Value::kString:
      return "string";
    case Value::kList:
      return "list";
    case Value::kDict:
      return "dict";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return false;
    case Value::kBool:
      return v.b;
    case Value::kInt:
      return v.i != 0;
    case Value::kString:
      return !v.s.empty();
    case Value::kList:
      return !v.list->empty();
    case Value::kDict:
      return !v.dict->empty();
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kBool:
      return a.b == b.b;
    case Value::kInt:
      return a.i == b.i;
    case Value::kString:
      return a.s == b.s;
    case Value::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (size_t k = 0; k < a.dict->size(); ++k) {
        if ((*a.dict)[k].first != (*b.dict)[k].first ||
            !Equal((*a.dict)[k].second, (*b.dict)[k].second)) {
          return false;
        }
      }
      return true;
  }
  return false;
}

// ---- UTF-8 helpers (Python's str semantics: code points, str.isspace) ---------------------------

// Where each code point of `s` starts, then s.size(): code point k is s[at[k], at[k + 1]).
std::vector<size_t> CodePointStarts(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size();) {
    at.push_back(i);
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 1;
    i += std::min(n, s.size() - i);
  }
  at.push_back(s.size());
  return at;
}

bool IsPySpace(const std::string& ch) {
  static const std::vector<std::string> kSpaces = {
      " ",      "\t",     "\n",     "\v",     "\f",     "\r",     "\x1c",   "\x1d",
      "\x1e",   "\x1f",   "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
      "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
      "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  for (const auto& sp : kSpaces) {
    if (ch == sp) return true;
  }
  return false;
}

std::string Strip(const std::string& s, bool left, bool right) {
  const std::vector<size_t> at = CodePointStarts(s);
  auto code_point = [&](size_t k) { return s.substr(at[k], at[k + 1] - at[k]); };
  size_t begin = 0, end = at.size() - 1;
  while (left && begin < end && IsPySpace(code_point(begin))) ++begin;
  while (right && end > begin && IsPySpace(code_point(end - 1))) --end;
  return s.substr(at[begin], at[end] - at[begin]);
}

bool IsAscii(const std::string& s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

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

bool IsWs(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// @huggingface/jinja's preprocess (transformers renders with trim_blocks and lstrip_blocks): drop
// one trailing newline; remove spaces/tabs from a line's start up to "{%" "{#" "{-"; remove the
// newline right after "%}" "#}" "-}".
std::string Preprocess(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::string out;
  size_t line_start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '\n') {
      std::string line = s.substr(line_start, i - line_start);
      size_t k = 0;
      while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
      if (k + 1 < line.size() && line[k] == '{' &&
          (line[k + 1] == '#' || line[k + 1] == '%' || line[k + 1] == '-')) {
        line.erase(0, k);
      }
      out += line;
      if (i < s.size()) out += '\n';
      line_start = i + 1;
    }
  }
  std::string trimmed;
  for (size_t i = 0; i < out.size(); ++i) {
    trimmed += out[i];
    if (out[i] == '}' && i > 0 && (out[i - 1] == '#' || out[i - 1] == '%' || out[i - 1] == '-') &&
        i + 1 < out.size() && out[i + 1] == '\n') {
      ++i;  // drop the newline
    }
  }
  return trimmed;
}

std::vector<Tok> Lex(const std::string& source) {
  const std::string src = Preprocess(source);
  std::vector<Tok> toks;
  size_t pos = 0;
  int line = 1;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && pos < src.size(); ++k, ++pos) {
      if (src[pos] == '\n') ++line;
    }
  };
  auto strip_trailing = [&] {
    if (!toks.empty() && toks.back().kind == Tok::kText) {
      std::string& t = toks.back().text;
      while (!t.empty() && IsWs(t.back())) t.pop_back();
      if (t.empty()) toks.pop_back();
    }
  };
  auto skip_ws = [&] {
    while (pos < src.size() && IsWs(src[pos])) advance(1);
  };
  auto starts = [&](const char* p) { return src.compare(pos, std::strlen(p), p) == 0; };
  bool in_tag = false;
  bool open_is_stmt = false;
  while (pos < src.size()) {
    if (!in_tag) {
      const int text_line = line;
      std::string text;
      while (pos < src.size() &&
             !(src[pos] == '{' && pos + 1 < src.size() &&
               (src[pos + 1] == '%' || src[pos + 1] == '{' || src[pos + 1] == '#'))) {
        text += src[pos];
        advance(1);
      }
      if (!text.empty()) toks.push_back({Tok::kText, text, text_line});
      if (pos >= src.size()) break;
      if (starts("{#")) {
        const int comment_line = line;
        advance(2);
        const bool strip_before = pos < src.size() && src[pos] == '-';
        const size_t end = src.find("#}", pos);
        KVDIFF_CHECK(end != std::string::npos, "chat template line {}: a {{# comment is not closed",
                     comment_line);
        const bool strip_after = end > pos && src[end - 1] == '-';
        if (strip_before) strip_trailing();
        advance(end + 2 - pos);
        if (strip_after) skip_ws();
        continue;
      }
      const bool stmt = starts("{%");
      const int open_line = line;
      advance(2);
      if (pos < src.size() && src[pos] == '-') {
        strip_trailing();
        advance(1);
      }
      toks.push_back({stmt ? Tok::kOpenStmt : Tok::kOpenExpr, stmt ? "{%" : "{{", open_line});
      in_tag = true;
      open_is_stmt = stmt;
      continue;
    }
    skip_ws();
    KVDIFF_CHECK(pos < src.size(), "chat template line {}: a tag is not closed", line);
    const int tok_line = line;
    if (starts("-%}") || starts("-}}") || starts("%}") || starts("}}")) {
      const bool dash = src[pos] == '-';
      const bool stmt = src[pos + (dash ? 1 : 0)] == '%';
      KVDIFF_CHECK(stmt == open_is_stmt,
                   "chat template line {}: \"{}\" closes a tag opened by \"{}\"", tok_line,
                   stmt ? "%}" : "}}", open_is_stmt ? "{%" : "{{");
      advance(dash ? 3 : 2);
      toks.push_back({stmt ? Tok::kCloseStmt : Tok::kCloseExpr, stmt ? "%}" : "}}", tok_line});
      if (dash) skip_ws();
      in_tag = false;
      continue;
    }
    const char c = src[pos];
    if (c == '\'' || c == '"') {
      advance(1);
      std::string value;
      while (true) {
        KVDIFF_CHECK(pos < src.size(), "chat template line {}: a string is not closed", tok_line);
        const char d = src[pos];
        if (d == c) break;
        if (d == '\\') {
          KVDIFF_CHECK(pos + 1 < src.size(), "chat template line {}: a string is not closed",
                       tok_line);
          const char e = src[pos + 1];
          static const std::map<char, char> kEscapes = {{'n', '\n'},  {'t', '\t'}, {'r', '\r'},
                                                        {'b', '\b'},  {'f', '\f'}, {'v', '\v'},
                                                        {'\'', '\''}, {'"', '"'},  {'\\', '\\'}};
          auto it = kEscapes.find(e);
          KVDIFF_CHECK(it != kEscapes.end(),
                       "chat template line {}: the escape \\{} is not implemented", tok_line, e);
          value += it->second;
          advance(2);
          continue;
        }
        value += d;
        advance(1);
      }
      advance(1);
      toks.push_back({Tok::kString, value, tok_line});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::string digits;
      while (pos < src.size() && std::isdigit(static_cast<unsigned char>(src[pos]))) {
        digits += src[pos];
        advance(1);
      }
      KVDIFF_CHECK(!(pos < src.size() && src[pos] == '.' && pos + 1 < src.size() &&
                     std::isdigit(static_cast<unsigned char>(src[pos + 1]))),
                   "chat template line {}: floating-point numbers are not implemented", tok_line);
      KVDIFF_CHECK(digits.size() <= 18, "chat template line {}: the number {} is too large",
                   tok_line, digits);
      toks.push_back({Tok::kInt, digits, tok_line});
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::string name;
      while (pos < src.size() &&
             (std::isalnum(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) {
        name += src[pos];
        advance(1);
      }
      toks.push_back({Tok::kName, name, tok_line});
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                   "]",  "{",  "}",  ",",  ".",  ":",  "|"};
      bool found = false;
      for (const char* op : kOps) {
        if (starts(op)) {
          toks.push_back({Tok::kOp, op, tok_line});
          advance(std::strlen(op));
          found = true;
          break;
        }
      }
      KVDIFF_CHECK(found, "chat template line {}: unexpected character '{}'", tok_line, c);
    }
  }
  KVDIFF_CHECK(!in_tag, "chat template line {}: a tag is not closed at the end", line);
  toks.push_back({Tok::kEnd, "", line});
  return toks;
}

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

}  // namespace

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet } kind;
  std::string text;  // kText; kFor, kSet: the variable
  ExprPtr expr;      // kOutput, kIf (condition), kFor (iterable), kSet (value)
  std::vector<std::shared_ptr<Node>> body, orelse;
  int line = 0;
};

namespace {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<Node>;

class Parser {
 public:
  explicit Parser(std::vector<Tok> toks) : toks_(std::move(toks)) {}

  std::vector<NodePtr> ParseTemplate() {
    std::vector<NodePtr> body = ParseBody({});
    KVDIFF_CHECK(Peek().kind == Tok::kEnd, "chat template line {}: unexpected {{% {} %}}",
                 Peek().line, Peek().text);
    return body;
  }

 private:
  const Tok& Peek(size_t ahead = 0) const { return toks_[std::min(at_ + ahead, toks_.size() - 1)]; }
  Tok Next() { return toks_[std::min(at_++, toks_.size() - 1)]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }
  void ExpectOp(const char* op) {
    KVDIFF_CHECK(IsOp(op), "chat template line {}: expected '{}', found '{}'", Peek().line, op,
                 Peek().text);
    ++at_;
  }
  void Expect(Tok::Kind kind, const char* what) {
    KVDIFF_CHECK(Peek().kind == kind, "chat template line {}: expected {}, found '{}'", Peek().line,
                 what, Peek().text);
    ++at_;
  }
  std::string ExpectName(const char* what) {
    KVDIFF_CHECK(Peek().kind == Tok::kName, "chat template line {}: expected {}, found '{}'",
                 Peek().line, what, Peek().text);
    return Next().text;
  }

  // One level of the parser's recursion (every recursive path passes ParseStatement or
  // ParseExpr), refused beyond kMaxNesting.
  class Level {
   public:
    Level(int& depth, int line) : depth_(depth) {
      KVDIFF_CHECK(depth_ < kMaxNesting, "chat template line {}: nesting deeper than {} levels",
                   line, kMaxNesting);
      ++depth_;
    }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;
    ~Level() { --depth_; }

   private:
    int& depth_;
  };

  // Nodes until "{% <one of stop> ..." (left unconsumed) or the end.
  std::vector<NodePtr> ParseBody(const std::vector<std::string>& stop) {
    std::vector<NodePtr> nodes;
    while (Peek().kind != Tok::kEnd) {
      const Tok& t = Peek();
      if (t.kind == Tok::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::kText;
        n->text = t.text;
        n->line = t.line;
        nodes.push_back(n);
        ++at_;
      } else if (t.kind == Tok::kOpenExpr) {
        auto n = std::make_shared<Node>();
        n->kind = Node::kOutput;
        n->line = t.line;
        ++at_;
        n->expr = ParseExpr();
        Expect(Tok::kCloseExpr, "'}}'");
        nodes.push_back(n);
      } else if (t.kind == Tok::kOpenStmt) {
        const Tok& keyword = Peek(1);
        for (const std::string& s : stop) {
          if (keyword.kind == Tok::kName && keyword.text == s) return nodes;
        }
        nodes.push_back(ParseStatement());
      } else {
        throw InputError(fmt::format("chat template line {}: unexpected '{}'", t.line, t.text));
      }
    }
    return nodes;
  }

  NodePtr ParseStatement() {
    const Level level(depth_, Peek().line);
    Expect(Tok::kOpenStmt, "'{%'");
    const int line = Peek().line;
    const std::string keyword = ExpectName("a statement");
    auto n = std::make_shared<Node>();
    n->line = line;
    if (keyword == "set") {
      n->kind = Node::kSet;
      n->text = ExpectName("a variable after set");
      KVDIFF_CHECK(IsOp("="),
                   "chat template line {}: only \"{{% set name = value %}}\" is implemented "
                   "(not attribute, tuple or block assignment)",
                   line);
      ++at_;
      n->expr = ParseExpr();
      Expect(Tok::kCloseStmt, "'%}'");
    } else if (keyword == "if" || keyword == "elif") {
      n->kind = Node::kIf;
      n->expr = ParseExpr();
      Expect(Tok::kCloseStmt, "'%}'");
      n->body = ParseBody({"elif", "else", "endif"});
      KVDIFF_CHECK(Peek().kind == Tok::kOpenStmt,
                   "chat template line {}: {{% if %}} is not closed by {{% endif %}}", line);
      if (IsName("elif", 1)) {
        n->orelse.push_back(ParseStatement());  // the elif, which consumes the endif
        return n;
      }
      if (IsName("else", 1)) {
        at_ += 2;
        Expect(Tok::kCloseStmt, "'%}'");
        n->orelse = ParseBody({"endif", "elif", "else"});
        KVDIFF_CHECK(IsName("endif", 1),
                     "chat template line {}: {{% else %}} is not followed by {{% endif %}}", line);
      }
      at_ += 2;  // {% endif
      Expect(Tok::kCloseStmt, "'%}'");
    } else if (keyword == "for") {
      n->kind = Node::kFor;
      n->text = ExpectName("a loop variable");
      KVDIFF_CHECK(!IsOp(","),
                   "chat template line {}: for with several loop variables is not implemented",
                   line);
      KVDIFF_CHECK(IsName("in"), "chat template line {}: expected 'in' after the loop variable",
                   line);
      ++at_;
      n->expr = ParseOr();  // not ParseExpr: "for x in xs if cond" must not read as a ternary
      KVDIFF_CHECK(!IsName("if") && !IsName("recursive"),
                   "chat template line {}: for ... {} is not implemented", line, Peek().text);
      Expect(Tok::kCloseStmt, "'%}'");
      n->body = ParseBody({"endfor", "else"});
      KVDIFF_CHECK(
          IsName("endfor", 1),
          "chat template line {}: {{% for %}} is not closed by {{% endfor %}} ({{% else %}} "
          "in a for loop is not implemented)",
          line);
      at_ += 2;
      Expect(Tok::kCloseStmt, "'%}'");
    } else {
      throw InputError(fmt::format(
          "chat template line {}: {{% {} %}} is not implemented (supported: set, if, elif, else, "
          "for)",
          line, keyword));
    }
    return n;
  }

  // A node over `kids`. Loops build chains ("a + b + c", "x.y.z", "x | f | g") as deep as they are
  // long without recursing, so the tree's depth is checked here as well as the parser's.
  ExprPtr Make(Expr::Kind kind, int line, std::vector<ExprPtr> kids = {}) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->line = line;
    e->kids = std::move(kids);
    for (const ExprPtr& k : e->kids) {
      if (k) e->depth = std::max(e->depth, k->depth + 1);
    }
    KVDIFF_CHECK(e->depth <= kMaxNesting, "chat template line {}: nesting deeper than {} levels",
                 line, kMaxNesting);
    return e;
  }

  ExprPtr ParseExpr() {
    const Level level(depth_, Peek().line);
    ExprPtr value = ParseOr();
    if (IsName("if")) {
      const int line = Next().line;
      ExprPtr cond = ParseOr();
      ExprPtr otherwise;
      if (IsName("else")) {
        ++at_;
        otherwise = ParseExpr();
      }
      return Make(Expr::kTernary, line, {value, cond, otherwise});
    }
    return value;
  }
  ExprPtr Binary(const std::string& op, int line, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(Expr::kBinary, line, {std::move(a), std::move(b)});
    e->op = op;
    return e;
  }
  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const int line = Next().line;  // before the operand: argument order is unspecified
      e = Binary("or", line, e, ParseAnd());
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const int line = Next().line;
      e = Binary("and", line, e, ParseNot());
    }
    return e;
  }
  // Prefix operators are read in a loop, not by recursion; Make bounds how many.
  ExprPtr Prefixed(const char* op, std::vector<int> lines, ExprPtr e) {
    for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
      e = Make(Expr::kUnary, *line, {e});
      e->op = op;
    }
    return e;
  }
  ExprPtr ParseNot() {
    std::vector<int> lines;
    while (IsName("not")) lines.push_back(Next().line);
    return Prefixed("not", lines, ParseCompare());
  }
  ExprPtr ParseCompare() {
    ExprPtr e = ParseAdd();
    while (true) {
      const int line = Peek().line;
      if (Peek().kind == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        const std::string op = Next().text;
        e = Binary(op, line, e, ParseAdd());
      } else if (IsName("in")) {
        ++at_;
        e = Binary("in", line, e, ParseAdd());
      } else if (IsName("not") && IsName("in", 1)) {
        at_ += 2;
        e = Binary("not in", line, e, ParseAdd());
      } else {
        return e;
      }
    }
  }
  ExprPtr ParseAdd() {
    ExprPtr e = ParseMul();
    while (IsOp("+") || IsOp("-") || IsOp("~")) {
      const Tok t = Next();
      e = Binary(t.text, t.line, e, ParseMul());
    }
    return e;
  }
  ExprPtr ParseMul() {
    ExprPtr e = ParseTest();
    while (IsOp("*") || IsOp("%") || IsOp("/") || IsOp("//") || IsOp("**")) {
      const Tok t = Next();
      KVDIFF_CHECK(t.text == "*" || t.text == "%",
                   "chat template line {}: the operator {} is not implemented", t.line, t.text);
      e = Binary(t.text, t.line, e, ParseTest());
    }
    return e;
  }
  ExprPtr ParseTest() {
    ExprPtr e = ParseFilter();
    while (IsName("is")) {
      const int line = Next().line;
      const bool negate = IsName("not");
      if (negate) ++at_;
      ExprPtr t = Make(Expr::kTest, line, {e});
      t->name = ExpectName("a test name after 'is'");
      t->op = negate ? "not" : "";
      e = t;
    }
    return e;
  }
  ExprPtr ParseFilter() {
    ExprPtr e = ParseUnary();
    while (IsOp("|")) {
      const int line = Next().line;
      const std::string name = ExpectName("a filter name after '|'");
      std::vector<ExprPtr> kids = {e};
      if (IsOp("(")) {
        for (ExprPtr& a : ParseArgs()) kids.push_back(a);
      }
      e = Make(Expr::kFilter, line, kids);
      e->name = name;
    }
    return e;
  }
  ExprPtr ParseUnary() {
    std::vector<int> lines;
    while (IsOp("-")) lines.push_back(Next().line);
    return Prefixed("-", lines, ParsePostfix());
  }
  std::vector<ExprPtr> ParseArgs() {
    ExpectOp("(");
    std::vector<ExprPtr> args;
    while (!IsOp(")")) {
      KVDIFF_CHECK(!(Peek().kind == Tok::kName && IsOp("=", 1)),
                   "chat template line {}: keyword arguments are not implemented ({}=...)",
                   Peek().line, Peek().text);
      args.push_back(ParseExpr());
      if (!IsOp(")")) ExpectOp(",");
    }
    ++at_;
    return args;
  }
  ExprPtr ParsePostfix() {
    ExprPtr e = ParsePrimary();
    while (true) {
      const int line = Peek().line;
      if (IsOp(".")) {
        ++at_;
        ExprPtr key = Make(Expr::kLiteral, line);
        key->literal = Value::Str(ExpectName("an attribute name after '.'"));
        e = Make(Expr::kMember, line, {e, key});
        e->name = ".";
      } else if (IsOp("[")) {
        ++at_;
        ExprPtr parts[3];
        int colons = 0;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            ++at_;
            ++colons;
            KVDIFF_CHECK(colons <= 2, "chat template line {}: a slice has at most 3 parts", line);
          } else {
            KVDIFF_CHECK(!parts[colons], "chat template line {}: expected ':' or ']'", line);
            parts[colons] = ParseExpr();
          }
        }
        ++at_;
        if (colons == 0) {
          KVDIFF_CHECK(parts[0], "chat template line {}: empty []", line);
          e = Make(Expr::kMember, line, {e, parts[0]});
          e->name = "[]";
        } else {
          e = Make(Expr::kSlice, line, {e, parts[0], parts[1], parts[2]});
        }
      } else if (IsOp("(")) {
        std::vector<ExprPtr> kids = {e};
        for (ExprPtr& a : ParseArgs()) kids.push_back(a);
        e = Make(Expr::kCall, line, kids);
      } else {
        return e;
      }
    }
  }
  ExprPtr ParsePrimary() {
    const Tok t = Next();
    ExprPtr e = Make(Expr::kLiteral, t.line);
    switch (t.kind) {
      case Tok::kInt:
        e->literal = Value::Int(std::stoll(t.text));
        return e;
      case Tok::kString:
        e->literal = Value::Str(t.text);
        return e;
      case Tok::kName:
        if (t.text == "true" || t.text == "True")
          e->literal = Value::Bool(true);
        else if (t.text == "false" || t.text == "False")
          e->literal = Value::Bool(false);
        else if (t.text == "none" || t.text == "None")
          e->literal = Value::None();
        else {
          e->kind = Expr::kVar;
          e->name = t.text;
        }
        return e;
      case Tok::kOp:
        if (t.text == "(") {
          ExprPtr inner = ParseExpr();
          KVDIFF_CHECK(!IsOp(","), "chat template line {}: tuples are not implemented", t.line);
          ExpectOp(")");
          return inner;
        }
        if (t.text == "[") {
          std::vector<ExprPtr> items;
          while (!IsOp("]")) {
            items.push_back(ParseExpr());
            if (!IsOp("]")) ExpectOp(",");
          }
          ++at_;
          return Make(Expr::kListLit, t.line, items);
        }
        KVDIFF_CHECK(t.text != "{", "chat template line {}: dict literals are not implemented",
                     t.line);
        break;
      default:
        break;
    }
    throw InputError(
        fmt::format("chat template line {}: expected an expression, found '{}'", t.line, t.text));
  }

  std::vector<Tok> toks_;
  size_t at_ = 0;
  int depth_ = 0;  // of the parser's recursion (Level)
};

// ---- evaluation -------------------------------------------------------------------------------

class Renderer {
 public:
  explicit Renderer(std::map<std::string, Value> globals) { scopes_.push_back(std::move(globals)); }

  void Run(const std::vector<NodePtr>& nodes) {
    for (const NodePtr& n : nodes) Exec(*n);
  }
  std::string out;

 private:
  [[noreturn]] static void Fail(int line, const std::string& message) {
    throw InputError(fmt::format("chat template line {}: {}", line, message));
  }

  // Counts one statement or expression against kMaxRenderSteps.
  void Step(int line) {
    if (++steps_ > kMaxRenderSteps) {
      Fail(line,
           fmt::format("rendering took more than {} steps (loops inside loops?)", kMaxRenderSteps));
    }
  }
  // Counts a text an expression yields (or one more piece of the output) against kMaxTextBytes
  // and kMaxRenderBytes.
  void Text(size_t bytes, size_t total, int line) {
    if (total > kMaxTextBytes) {
      Fail(line, fmt::format("a text of {} bytes is larger than the limit of {} MiB", total,
                             kMaxTextBytes >> 20));
    }
    text_bytes_ += bytes;
    if (text_bytes_ > kMaxRenderBytes) {
      Fail(line, fmt::format("rendering handled more than {} MiB of text", kMaxRenderBytes >> 20));
    }
  }
  // a op b for op + - *, refused when the result does not fit in 64 bits.
  static int64_t Arithmetic(char op, int64_t a, int64_t b, int line) {
    int64_t r = 0;
    const bool overflow = op == '+'   ? __builtin_add_overflow(a, b, &r)
                          : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                      : __builtin_mul_overflow(a, b, &r);
    if (overflow)
      Fail(line, fmt::format("integer overflow: {} {} {} needs more than 64 bits", a, op, b));
    return r;
  }

  void Exec(const Node& n) {
    Step(n.line);
    switch (n.kind) {
      case Node::kText:
        Text(n.text.size(), out.size() + n.text.size(), n.line);
        out += n.text;
        break;
      case Node::kOutput: {
        const std::string piece = Print(Eval(*n.expr), n.line);
        Text(piece.size(), out.size() + piece.size(), n.line);
        out += piece;
        break;
      }
      case Node::kSet:
        scopes_.back()[n.text] = Eval(*n.expr);
        break;
      case Node::kIf:
        Run(Truthy(Eval(*n.expr)) ? n.body : n.orelse);
        break;
      case Node::kFor: {
        const Value items = Eval(*n.expr);
        if (items.kind != Value::kList) {
          Fail(n.line,
               fmt::format("for over a {} is not implemented (only lists)", KindName(items)));
        }
        const auto length = static_cast<int64_t>(items.list->size());
        for (int64_t k = 0; k < length; ++k) {
          // Jinja scoping: what the body sets stays in the iteration.
          std::map<std::string, Value> scope;
          scope[n.text] = (*items.list)[k];
          scope["loop"] = Value::MakeDict({{"index", Value::Int(k + 1)},
                                           {"index0", Value::Int(k)},
                                           {"revindex", Value::Int(length - k)},
                                           {"revindex0", Value::Int(length - k - 1)},
                                           {"first", Value::Bool(k == 0)},
                                           {"last", Value::Bool(k == length - 1)},
                                           {"length", Value::Int(length)}});
          scopes_.push_back(std::move(scope));
          Run(n.body);
          scopes_.pop_back();
        }
        break;
      }
    }
  }

  // Text of a value in {{ }} and ~. Booleans and none print differently in Python's Jinja
  // ("True", "None") and transformers.js' ("true", "null"), so they are refused, not guessed.
  static std::string Print(const Value& v, int line) {
    switch (v.kind) {
      case Value::kUndefined:
        return "";
      case Value::kString:
        return v.s;
      case Value::kInt:
        return std::to_string(v.i);
      default:
        Fail(line, fmt::format("printing a {} is not implemented (Python and JavaScript Jinja "
                               "print it differently)",
                               KindName(v)));
    }
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  static Value Index(const Value& obj, const Value& key, const Expr& e) {
    if (obj.kind == Value::kDict && key.kind == Value::kString) {
      for (const auto& [k, v] : *obj.dict) {
        if (k == key.s) return v;
      }
      return Value();
    }
    if ((obj.kind == Value::kList || obj.kind == Value::kString) && key.kind == Value::kInt) {
      if (obj.kind == Value::kList) {
        const auto n = static_cast<int64_t>(obj.list->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        return k >= 0 && k < n ? (*obj.list)[k] : Value();
      }
      const std::vector<size_t> at = CodePointStarts(obj.s);
      const auto n = static_cast<int64_t>(at.size() - 1);
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      return k >= 0 && k < n ? Value::Str(obj.s.substr(at[k], at[k + 1] - at[k])) : Value();
    }
    if (obj.kind == Value::kList || obj.kind == Value::kString) {
      if (e.name == ".") return Value();  // a method name, resolved by the call
    }
    Fail(e.line, fmt::format("cannot index a {} with a {}{}", KindName(obj), KindName(key),
                             obj.kind == Value::kUndefined ? " (the value is undefined)" : ""));
  }

  Value Slice(const Expr& e) {
    const Value obj = Eval(*e.kids[0]);
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.kids[k + 1]) continue;
      const Value v = Eval(*e.kids[k + 1]);
      if (v.kind == Value::kNone) continue;
      if (v.kind != Value::kInt) Fail(e.line, "slice bounds must be integers");
      bounds[k] = v.i;
      given[k] = true;
    }
    if (bounds[2] == 0) Fail(e.line, "slice step cannot be zero");
    std::vector<Value> items;
    std::vector<size_t> at;  // code points of a string
    int64_t n = 0;
    if (obj.kind == Value::kList) {
      n = static_cast<int64_t>(obj.list->size());
    } else if (obj.kind == Value::kString) {
      at = CodePointStarts(obj.s);
      n = static_cast<int64_t>(at.size() - 1);
    } else {
      Fail(e.line, fmt::format("cannot slice a {}", KindName(obj)));
    }
    // Python's slice.indices.
    const int64_t step = bounds[2];
    auto clamp = [&](int64_t v, bool has, int64_t dflt) {
      if (!has) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::min(std::max(v, int64_t{0}), n);
      return std::min(std::max(v, int64_t{-1}), n - 1);
    };
    const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
    List list;
    std::string str;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (obj.kind == Value::kList)
        list.push_back((*obj.list)[k]);
      else
        str.append(obj.s, at[k], at[k + 1] - at[k]);
    }
    return obj.kind == Value::kList ? Value::MakeList(std::move(list)) : Value::Str(str);
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.kids[0];
    std::vector<Value> args;
    for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(Eval(*e.kids[k]));
    if (callee.kind == Expr::kVar && callee.name == "raise_exception") {
      if (args.size() != 1 || args[0].kind != Value::kString) {
        Fail(e.line, "raise_exception takes one string");
      }
      throw InputError(fmt::format("chat template raised an exception: {}", args[0].s));
    }
    if (callee.kind == Expr::kMember && callee.name == ".") {
      const Value obj = Eval(*callee.kids[0]);
      const std::string& method = callee.kids[1]->literal.s;
      auto want = [&](size_t n) {
        if (args.size() != n) {
          Fail(e.line,
               fmt::format("{}() takes {} argument(s) here, got {}", method, n, args.size()));
        }
      };
      if (obj.kind == Value::kString) {
        if (method == "strip" || method == "lstrip" || method == "rstrip") {
          want(0);
          return Value::Str(Strip(obj.s, method != "rstrip", method != "lstrip"));
        }
        if (method == "upper" || method == "lower") {
          want(0);
          return Value::Str(CaseMap(obj.s, method == "upper", e.line));
        }
        if (method == "startswith" || method == "endswith") {
          want(1);
          if (args[0].kind != Value::kString) Fail(e.line, method + "() takes a string");
          const std::string& s = obj.s;
          const std::string& p = args[0].s;
          const bool ok =
              p.size() <= s.size() &&
              (method == "startswith" ? s.compare(0, p.size(), p) == 0
                                      : s.compare(s.size() - p.size(), p.size(), p) == 0);
          return Value::Bool(ok);
        }
      }
      if (obj.kind == Value::kDict) {
        if (method == "get") {
          if (args.empty() || args.size() > 2) Fail(e.line, "get() takes 1 or 2 arguments");
          const Value v = Index(obj, args[0], callee);
          return v.kind == Value::kUndefined ? (args.size() == 2 ? args[1] : Value::None()) : v;
        }
        if (method == "items" || method == "keys" || method == "values") {
          want(0);
          List list;
          for (const auto& [k, v] : *obj.dict) {
            if (method == "items")
              list.push_back(Value::MakeList({Value::Str(k), v}));
            else
              list.push_back(method == "keys" ? Value::Str(k) : v);
          }
          return Value::MakeList(std::move(list));
        }
      }
      Fail(e.line, fmt::format("the method {}.{}() is not implemented", KindName(obj), method));
    }
    Fail(e.line, callee.kind == Expr::kVar
                     ? fmt::format("the function {}() is not implemented", callee.name)
                     : std::string("this call is not implemented"));
  }

  static std::string CaseMap(const std::string& s, bool upper, int line) {
    // Python's and JavaScript's Unicode case maps differ (e.g. "ß".upper()); ASCII only.
    if (!IsAscii(s)) Fail(line, "upper/lower of non-ASCII text is not implemented");
    std::string out = s;
    for (char& c : out) {
      c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                  : std::tolower(static_cast<unsigned char>(c)));
    }
    return out;
  }

  Value Filter(const Expr& e) {
    const Value v = Eval(*e.kids[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(Eval(*e.kids[k]));
    const std::string& f = e.name;
    auto want = [&](size_t n) {
      if (args.size() != n) {
        Fail(e.line,
             fmt::format("the filter {} takes {} argument(s) here, got {}", f, n, args.size()));
      }
    };
    if (f == "trim") {
      want(0);
      if (v.kind != Value::kString) Fail(e.line, fmt::format("trim of a {}", KindName(v)));
      return Value::Str(Strip(v.s, true, true));
    }
    if (f == "length" || f == "count") {
      want(0);
      if (v.kind == Value::kList) return Value::Int(static_cast<int64_t>(v.list->size()));
      if (v.kind == Value::kDict) return Value::Int(static_cast<int64_t>(v.dict->size()));
      if (v.kind == Value::kString) {
        return Value::Int(static_cast<int64_t>(CodePointStarts(v.s).size() - 1));
      }
      Fail(e.line, fmt::format("length of a {}", KindName(v)));
    }
    if (f == "upper" || f == "lower") {
      want(0);
      if (v.kind != Value::kString) Fail(e.line, fmt::format("{} of a {}", f, KindName(v)));
      return Value::Str(CaseMap(v.s, f == "upper", e.line));
    }
    if (f == "first" || f == "last") {
      want(0);
      if (v.kind != Value::kList)
        Fail(e.line, fmt::format("{} of a {} is not implemented", f, KindName(v)));
      if (v.list->empty()) return Value();
      return f == "first" ? v.list->front() : v.list->back();
    }
    if (f == "default" || f == "d") {
      if (args.size() != 1) Fail(e.line, "default takes one argument here");
      return v.kind == Value::kUndefined ? args[0] : v;
    }
    if (f == "string") {
      want(0);
      if (v.kind == Value::kString || v.kind == Value::kInt) return Value::Str(Print(v, e.line));
      Fail(e.line, fmt::format("string of a {} is not implemented", KindName(v)));
    }
    Fail(e.line, fmt::format("the filter {} is not implemented (supported: trim, length, count, "
                             "upper, lower, first, last, default, string)",
                             f));
  }

  Value Test(const Expr& e) {
    const Value v = Eval(*e.kids[0]);
    bool r = false;
    const std::string& t = e.name;
    if (t == "defined")
      r = v.kind != Value::kUndefined;
    else if (t == "undefined")
      r = v.kind == Value::kUndefined;
    else if (t == "none")
      r = v.kind == Value::kNone;
    else if (t == "string")
      r = v.kind == Value::kString;
    else if (t == "number" || t == "integer")
      r = v.kind == Value::kInt;
    else if (t == "boolean")
      r = v.kind == Value::kBool;
    else if (t == "true")
      r = v.kind == Value::kBool && v.b;
    else if (t == "false")
      r = v.kind == Value::kBool && !v.b;
    else if (t == "mapping")
      r = v.kind == Value::kDict;
    else {
      Fail(e.line, fmt::format("the test \"is {}\" is not implemented (supported: defined, "
                               "undefined, none, string, number, integer, boolean, true, false, "
                               "mapping)",
                               t));
    }
    return Value::Bool(e.op == "not" ? !r : r);
  }

  Value BinaryOp(const Expr& e) {
    const std::string& op = e.op;
    if (op == "and" || op == "or") {  // Python: the deciding operand itself
      const Value a = Eval(*e.kids[0]);
      if (Truthy(a) == (op == "or")) return a;
      return Eval(*e.kids[1]);
    }
    const Value a = Eval(*e.kids[0]);
    const Value b = Eval(*e.kids[1]);
    auto type_error = [&] {
      Fail(e.line, fmt::format("{} {} {} is not implemented", KindName(a), op, KindName(b)));
    };
    if (op == "==") return Value::Bool(Equal(a, b));
    if (op == "!=") return Value::Bool(!Equal(a, b));
    if (op == "~") return Value::Str(Print(a, e.line) + Print(b, e.line));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.kind == Value::kString && a.kind == Value::kString) {
        found = b.s.find(a.s) != std::string::npos;
      } else if (b.kind == Value::kList) {
        for (const Value& x : *b.list) found = found || Equal(a, x);
      } else if (b.kind == Value::kDict && a.kind == Value::kString) {
        for (const auto& kv : *b.dict) found = found || kv.first == a.s;
      } else {
        type_error();
      }
      return Value::Bool(op == "in" ? found : !found);
    }
    if (op == "+") {
      if (a.kind == Value::kString && b.kind == Value::kString) return Value::Str(a.s + b.s);
      if (a.kind == Value::kInt && b.kind == Value::kInt) {
        return Value::Int(Arithmetic('+', a.i, b.i, e.line));
      }
      if (a.kind == Value::kList && b.kind == Value::kList) {
        if (a.list->size() + b.list->size() > kMaxListItems) {
          Fail(e.line, fmt::format("a list of {} items is longer than the limit of {}",
                                   a.list->size() + b.list->size(), kMaxListItems));
        }
        List list = *a.list;
        list.insert(list.end(), b.list->begin(), b.list->end());
        return Value::MakeList(std::move(list));
      }
      type_error();
    }
    if (a.kind == Value::kInt && b.kind == Value::kInt) {
      if (op == "-" || op == "*") return Value::Int(Arithmetic(op[0], a.i, b.i, e.line));
      if (op == "%") {
        if (b.i == 0) Fail(e.line, "modulo by zero");
        if (b.i == -1) return Value::Int(0);  // INT64_MIN % -1 traps in C++
        int64_t r = a.i % b.i;
        if (r != 0 && ((r < 0) != (b.i < 0))) r += b.i;  // Python's sign: the divisor's
        return Value::Int(r);
      }
      if (op == "<") return Value::Bool(a.i < b.i);
      if (op == ">") return Value::Bool(a.i > b.i);
      if (op == "<=") return Value::Bool(a.i <= b.i);
      if (op == ">=") return Value::Bool(a.i >= b.i);
    }
    type_error();
    return Value();
  }

  Value Eval(const Expr& e) {
    Step(e.line);
    Value v = Evaluate(e);
    if (v.kind == Value::kString) Text(v.s.size(), v.s.size(), e.line);
    return v;
  }
  Value Evaluate(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return e.literal;
      case Expr::kVar:
        return Lookup(e.name);
      case Expr::kMember:
        return Index(Eval(*e.kids[0]), Eval(*e.kids[1]), e);
      case Expr::kSlice:
        return Slice(e);
      case Expr::kCall:
        return Call(e);
      case Expr::kFilter:
        return Filter(e);
      case Expr::kTest:
        return Test(e);
      case Expr::kUnary: {
        const Value v = Eval(*e.kids[0]);
        if (e.op == "not") return Value::Bool(!Truthy(v));
        if (v.kind != Value::kInt) Fail(e.line, fmt::format("-{} is not implemented", KindName(v)));
        return Value::Int(Arithmetic('-', 0, v.i, e.line));
      }
      case Expr::kBinary:
        return BinaryOp(e);
      case Expr::kTernary:
        if (Truthy(Eval(*e.kids[1]))) return Eval(*e.kids[0]);
        return e.kids[2] ? Eval(*e.kids[2]) : Value();
      case Expr::kListLit: {
        List list;
        for (const ExprPtr& k : e.kids) list.push_back(Eval(*k));
        Value v = Value::MakeList(std::move(list));
        // {% set x = [x] %} nests a value once per statement, however shallow the tree.
        if (v.depth > kMaxNesting) {
          Fail(e.line,
               fmt::format("nesting deeper than {} levels (a list in a list ...)", kMaxNesting));
        }
        return v;
      }
    }
    return Value();
  }

  std::vector<std::map<std::string, Value>> scopes_;
  int64_t steps_ = 0;      // Step()
  size_t text_bytes_ = 0;  // Text()
};

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source) {
  auto root = std::make_shared<Node>();
  root->kind = Node::kIf;  // an always-true if holding the template's nodes
  root->body = Parser(Lex(source)).ParseTemplate();
  root_ = root;
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token) const {
  List list;
  for (const ChatMessage& m : messages) {
    list.push_back(
        Value::MakeDict({{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}}));
  }
  Renderer renderer({{"messages", Value::MakeList(std::move(list))},
                     {"add_generation_prompt", Value::Bool(add_generation_prompt)},
                     {"bos_token", Value::Str(bos_token)},
                     {"eos_token", Value::Str(eos_token)}});
  renderer.Run(root_->body);
  return renderer.out;
}

std::vector<ChatMessage> ParseChatMessages(const std::string& text) {
  std::vector<ChatMessage> messages;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    const nlohmann::json j = ParseJsonDocument(text, "chat messages");
    for (size_t i = 0; i < j.size(); ++i) {
      const auto& m = j[i];
      KVDIFF_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                       m.contains("content") && m["content"].is_string(),
                   "chat messages[{}]: expected {{\"role\": string, \"content\": string}}, got {}",
                   i, JsonSnippet(m));
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
  } else {
    size_t line_no = 0;
    size_t begin = 0;
    while (begin <= text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(begin, end - begin);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t k = 0;
      while (k < line.size() &&
             (std::isalnum(static_cast<unsigned char>(line[k])) || line[k] == '_'))
        ++k;
      if (k > 0 && k < line.size() && line[k] == ':') {
        std::string content = line.substr(k + 1);
        if (!content.empty() && content[0] == ' ') content.erase(0, 1);
        messages.push_back({line.substr(0, k), content});
      } else if (!(end == text.size() && line.empty())) {
        KVDIFF_CHECK(!messages.empty(),
                     "chat messages line {}: expected \"role: text\" (e.g. \"user: Hello\"), got "
                     "{}",
                     line_no, JsonSnippet(nlohmann::json(line)));
        messages.back().content += "\n" + line;
      }
      begin = end + 1;
    }
  }
  KVDIFF_CHECK(!messages.empty(), "chat messages: none given");
  return messages;
}

std::optional<ModelChatTemplate> LoadChatTemplate(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json config =
      ParseJsonDocument(ReadInputFile(path, "tokenizer config"), path.string());
  if (!config.is_object() || !config.contains("chat_template") ||
      config["chat_template"].is_null()) {
    return std::nullopt;
  }
  KVDIFF_CHECK(config["chat_template"].is_string(),
               "{}: chat_template is a {}; only a single template (a string) is implemented",
               path.string(), config["chat_template"].type_name());
  std::string tokens[2];
  const char* keys[2] = {"bos_token", "eos_token"};
  for (int k = 0; k < 2; ++k) {
    if (!config.contains(keys[k]) || config[keys[k]].is_null()) continue;
    const auto& v = config[keys[k]];
    const auto& content = v.is_object() && v.contains("content") ? v["content"] : v;
    KVDIFF_CHECK(content.is_string(), "{}: {} must be a string or {{\"content\": ...}}",
                 path.string(), keys[k]);
    tokens[k] = content.get<std::string>();
  }
  try {
    return ModelChatTemplate{ChatTemplate(config["chat_template"].get<std::string>()), tokens[0],
                             tokens[1]};
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: chat_template: {}", path.string(), e.what()));
  }
}

Tokens EncodeChat(const std::filesystem::path& dir, const Tokenizer& tokenizer,
                  const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                  std::string* prompt) {
  const std::optional<ModelChatTemplate> chat = LoadChatTemplate(dir);
  KVDIFF_CHECK(chat, "{} has no chat template (tokenizer_config.json with a \"chat_template\")",
               dir.string());
  const std::string text =
      chat->chat_template.Render(messages, add_generation_prompt, chat->bos_token, chat->eos_token);
  if (prompt != nullptr) *prompt = text;
  return tokenizer.Encode(text, /*add_bos=*/false);
}

}  // namespace kvdiff::format
