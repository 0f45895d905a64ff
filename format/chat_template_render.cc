// The chat template's renderer: runs the syntax tree within the limits.
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

#include "format/affixes.h"
#include "format/chat_template_syntax.h"
#include "format/error.h"

namespace kvdiff::format::chat_template_detail {
namespace {

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

  // Adds `n` to a budget's count; past its limit the render fails with `message`, whose {} is the
  // limit.
  static void Spend(int64_t& used, size_t n, int64_t limit, int line, const char* message) {
    used += static_cast<int64_t>(n);
    if (used > limit) Fail(line, fmt::format(fmt::runtime(message), limit));
  }
  // One statement or expression.
  void Step(int line) {
    Spend(steps_, 1, kMaxRenderSteps, line,
          "rendering took more than {} steps (loops inside loops?)");
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
  // `n` list items created (each is memory that lives on).
  void Created(size_t n, int line) {
    Spend(list_items_, n, kMaxRenderListItems, line,
          "rendering created more than {} list items in all (a list doubled in a loop?)");
  }
  // `n` items, keys or bytes an `in` looks through.
  void Scanned(size_t n, int line) {
    Spend(scanned_, n, kMaxRenderScanned, line,
          "rendering looked through more than {} list items, keys and bytes with `in` (a long "
          "list searched in a loop?)");
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
    Created(list.size(), e.line);
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
          const bool ok = method == "startswith" ? StartsWith(s, p) : EndsWith(s, p);
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
          Created(obj.dict->size(), e.line);
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
        Scanned(b.s.size(), e.line);
        found = b.s.find(a.s) != std::string::npos;
      } else if (b.kind == Value::kList) {
        Scanned(b.list->size(), e.line);
        for (const Value& x : *b.list) found = found || Equal(a, x);
      } else if (b.kind == Value::kDict && a.kind == Value::kString) {
        Scanned(b.dict->size(), e.line);
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
        Created(a.list->size() + b.list->size(), e.line);
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
  int64_t steps_ = 0;       // Step()
  int64_t list_items_ = 0;  // Created()
  int64_t scanned_ = 0;     // Scanned()
  size_t text_bytes_ = 0;   // Text()
};

}  // namespace

std::string RenderTemplate(const std::vector<NodePtr>& nodes,
                           std::map<std::string, Value> globals) {
  Renderer renderer(std::move(globals));
  renderer.Run(nodes);
  return renderer.out;
}

}  // namespace kvdiff::format::chat_template_detail
