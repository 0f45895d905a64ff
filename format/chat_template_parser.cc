// The chat template's parser: statements and expressions into a syntax tree.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "format/chat_template_syntax.h"
#include "format/error.h"

namespace kvdiff::format::chat_template_detail {
namespace {

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

}  // namespace

std::vector<NodePtr> ParseTemplate(std::vector<Tok> tokens) {
  return Parser(std::move(tokens)).ParseTemplate();
}

}  // namespace kvdiff::format::chat_template_detail
