#include "harness/campaign/coverage.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <set>

#include "format/error.h"
#include "harness/scenario/conversations.h"

namespace kvdiff::harness {

std::string BucketName(int64_t lo) {
  return lo <= 1 ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, lo * 2 - 1);
}

namespace {

int64_t Bucket(int64_t n) {
  int64_t b = 1;
  while (b * 2 <= n) b *= 2;
  return n < 1 ? 0 : b;
}

template <typename Key>
void AddAll(std::map<Key, int64_t>& into, const std::map<Key, int64_t>& from) {
  for (const auto& [key, n] : from) into[key] += n;
}

std::string Histogram(const std::map<int64_t, int64_t>& h) {
  std::string out;
  for (const auto& [lo, n] : h)
    out += fmt::format("{}{}: {}", out.empty() ? "" : ", ", BucketName(lo), n);
  return out;
}

nlohmann::json HistogramJson(const std::map<int64_t, int64_t>& h) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [lo, n] : h) j[BucketName(lo)] = n;
  return j;
}

// "1", "2-3", "4-7": a bucket's name back to its lower end.
int64_t BucketLow(const std::string& name, const std::string& where) {
  try {
    size_t used = 0;
    const int64_t lo = std::stoll(name, &used);
    if (lo >= 1 && (used == name.size() || name[used] == '-')) return lo;
  } catch (const std::exception&) {
  }
  throw InputError(fmt::format("{}: expected a bucket such as \"4-7\", got \"{}\"", where, name));
}

int64_t Count(const nlohmann::json& j, const char* key, const std::string& where) {
  KVDIFF_CHECK(j.contains(key) && j.at(key).is_number_integer() && j.at(key).get<int64_t>() >= 0,
               "{}.{}: expected a count >= 0", where, key);
  return j.at(key).get<int64_t>();
}

template <typename Key, typename ToKey>
std::map<Key, int64_t> CountsFromJson(const nlohmann::json& j, const char* key,
                                      const std::string& where, ToKey to_key) {
  const std::string at = fmt::format("{}.{}", where, key);
  KVDIFF_CHECK(j.contains(key) && j.at(key).is_object(), "{}: expected an object of counts", at);
  std::map<Key, int64_t> out;
  for (auto it = j.at(key).begin(); it != j.at(key).end(); ++it) {
    KVDIFF_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0,
                 "{}.{}: expected a count >= 0", at, it.key());
    out[to_key(it.key(), at)] += it.value().get<int64_t>();
  }
  return out;
}

}  // namespace

Coverage Coverage::FromJson(const nlohmann::json& j, const std::string& where) {
  KVDIFF_CHECK(j.is_object(), "{}: expected the coverage object of a `check --json` report", where);
  Coverage c;
  c.cases = Count(j, "cases", where);
  c.long_cases = Count(j, "long_cases", where);
  c.context = Count(j, "context", where);
  c.longest = Count(j, "longest", where);
  c.cases_at_context = Count(j, "cases_at_context", where);
  if (j.contains("reach_limit") && j.at("reach_limit").is_string())  // since 0.3
    c.reach_limit = j.at("reach_limit").get<std::string>();
  if (j.contains("shift_limit") && j.at("shift_limit").is_string())  // since shift steps
    c.shift_limit = j.at("shift_limit").get<std::string>();
  c.lengths = CountsFromJson<int64_t>(j, "lengths", where, BucketLow);
  c.call_sizes = CountsFromJson<int64_t>(j, "call_sizes", where, BucketLow);
  c.conversations = CountsFromJson<int64_t>(j, "conversations", where, BucketLow);
  const auto as_text = [](const std::string& key, const std::string&) { return key; };
  c.ops = CountsFromJson<std::string>(j, "ops", where, as_text);
  c.bigrams = CountsFromJson<std::string>(j, "bigrams", where, as_text);
  c.shapes = CountsFromJson<std::string>(j, "shapes", where, as_text);
  if (j.contains("batches"))  // reports written before batch steps have none
    c.batches = CountsFromJson<std::string>(j, "batches", where, as_text);
  if (j.contains("shifts"))  // nor of shift steps before the campaign drew them
    c.shifts = CountsFromJson<std::string>(j, "shifts", where, as_text);
  if (j.contains("windows"))  // nor of windows before sliding-window models
    c.windows = CountsFromJson<std::string>(j, "windows", where, as_text);
  if (j.contains("deep"))  // nor of deep ops before deep cases
    c.deep = CountsFromJson<std::string>(j, "deep", where, as_text);
  KVDIFF_CHECK(j.contains("boundaries") && j.at("boundaries").is_array(),
               "{}.boundaries: expected an array", where);
  for (size_t i = 0; i < j.at("boundaries").size(); ++i) {
    const nlohmann::json& b = j.at("boundaries")[i];
    const std::string at = fmt::format("{}.boundaries[{}]", where, i);
    KVDIFF_CHECK(b.is_object() && b.contains("declared_by") && b.at("declared_by").is_string(),
                 "{}: expected a boundary object with \"declared_by\"", at);
    c.boundaries.push_back({Count(b, "size", at), b.at("declared_by").get<std::string>(),
                            Count(b, "calls_at", at), Count(b, "calls_over", at),
                            Count(b, "rows_at", at), Count(b, "rows_over", at)});
  }
  return c;
}

Coverage NewCoverage(const std::vector<Boundary>& boundaries, int64_t context) {
  Coverage c;
  c.context = context;
  for (const Boundary& b : boundaries) c.boundaries.push_back({b.size, b.declared_by});
  return c;
}

void Coverage::Add(const Scenario& sc, const std::string& shape, bool long_case,
                   int64_t case_context, int64_t window) {
  ++cases;
  long_cases += long_case ? 1 : 0;
  ++shapes[shape];
  Conversations convs;
  int64_t case_longest = 0;
  std::string prev;
  std::set<std::string> in_last_batch;
  std::set<std::string> forked;  // conversations a fork made
  const Step* last = nullptr;
  auto count_call = [&](int64_t n) {
    ++call_sizes[Bucket(n)];
    for (BoundaryCoverage& b : boundaries) {
      if (n == b.size - 1 || n == b.size) ++b.calls_at;
      if (n > b.size) ++b.calls_over;
    }
  };
  for (const Step& s : sc.steps) {
    const std::string op = OpName(s.op);
    ++ops[op];
    if (!prev.empty()) ++bigrams[prev + ">" + op];
    prev = op;
    int64_t batch_tokens = 0;
    for (const ForwardCall& call : convs.CallsOf(s)) {
      const int64_t from = call.first_position, n = call.size;
      if (s.op == Op::kBatch)
        batch_tokens += n;
      else
        count_call(n);
      for (BoundaryCoverage& b : boundaries) {
        // Rows from..from+n-1: position b-1 among them, and any at b or beyond.
        if (from <= b.size - 1 && b.size - 1 < from + n) ++b.rows_at;
        if (from + n - 1 >= b.size) b.rows_over += from + n - std::max(from, b.size);
      }
      case_longest = std::max(case_longest, from + n);
      if (window > 0) {
        if (from + n >= window - 1 && from + n <= window + 1) ++windows["ends at W-1..W+1"];
        if (n > window) ++windows["over W"];
        if (from >= window) ++windows["after a drop"];
      }
    }
    if (window > 0 && (s.op == Op::kTruncate || s.op == Op::kFork)) {
      const std::string& name = s.op == Op::kFork ? s.from : s.conversation;
      if (convs.At(name).furthest > window)
        ++windows[s.op == Op::kFork ? "fork after a drop" : "truncate after a drop"];
    }
    if (s.op == Op::kBatch) {
      count_call(batch_tokens);
      AddBatch(s, in_last_batch);
    }
    AddDepth(s, convs);
    AddShift(s, last, convs, forked);
    if (s.op == Op::kFork) forked.insert(s.to);
    if (s.op == Op::kNewConversation || s.op == Op::kReset) forked.erase(s.conversation);
    convs.Apply(s);
    last = &s;
  }
  if (window > 0) {
    ++windows["cases"];
    if (case_longest > window) ++windows["crossed"];
    if (case_longest > 2 * window) ++windows["twice"];
  }
  ++lengths[Bucket(case_longest)];
  ++conversations[static_cast<int64_t>(convs.Names().size())];
  longest = std::max(longest, case_longest);
  const int64_t reachable = case_context > 0 ? case_context : context;
  cases_at_context += case_longest >= reachable && reachable > 0 ? 1 : 0;
}

void Coverage::AddShift(const Step& s, const Step* last, const Conversations& convs,
                        const std::set<std::string>& forked) {
  const bool after_shift =
      last != nullptr && last->op == Op::kShift && last->conversation == s.conversation;
  if (after_shift && s.op == Op::kDecode) ++shifts["then decode"];
  if (after_shift && s.op == Op::kTruncate && s.length <= last->keep)
    ++shifts["then truncate to keep"];
  if (s.op != Op::kShift) return;
  const int64_t length = convs.At(s.conversation).length;
  ++shifts["steps"];
  if (s.keep == 0) ++shifts["keep 0"];
  if (s.keep == 1) ++shifts["keep 1"];
  if (s.discard == 0) ++shifts["discard 0"];
  if (s.discard > 0 && s.keep + s.discard == length) ++shifts["nothing after keep"];
  if (after_shift && last->discard > 0 && s.discard > 0) ++shifts["twice before a call"];
  if (forked.count(s.conversation) > 0) ++shifts["of a fork"];
}

void Coverage::AddBatch(const Step& s, std::set<std::string>& in_last_batch) {
  ++batches["calls"];
  ++batches[fmt::format("items {}", s.items.size())];
  int64_t decodes = 0;
  std::set<std::string> now;
  for (const BatchEntry& item : s.items) {
    decodes += item.decode ? 1 : 0;
    ++batches["rows " + BatchLogitsName(item.logits)];
    now.insert(item.conversation);
    if (in_last_batch.count(item.conversation) == 0) ++batches["joined"];
  }
  for (const std::string& name : in_last_batch)
    if (now.count(name) == 0) ++batches["left"];
  const auto n = static_cast<int64_t>(s.items.size());
  ++batches[decodes == 0 ? "mix prefill" : decodes == n ? "mix decode" : "mix mixed"];
  in_last_batch = std::move(now);
}

void Coverage::AddDepth(const Step& s, const Conversations& convs) {
  auto count = [&](const std::string& what, const std::string& conversation) {
    ++deep[what];
    if (convs.At(conversation).length > kDeepPosition) ++deep[what + " deep"];
    if (convs.At(conversation).length > kFarPosition) ++deep[what + " far"];
  };
  if (s.op == Op::kFork) count("fork", s.from);
  if (s.op == Op::kTruncate) count("truncate", s.conversation);
  if (s.op == Op::kEnd) count("end", s.conversation);
  if (s.op == Op::kBatch)
    for (const BatchEntry& item : s.items) count("batch item", item.conversation);
}

void Coverage::Merge(const Coverage& o) {
  cases += o.cases;
  long_cases += o.long_cases;
  context = std::max(context, o.context);
  if (reach_limit.empty()) reach_limit = o.reach_limit;
  if (shift_limit.empty()) shift_limit = o.shift_limit;
  longest = std::max(longest, o.longest);
  cases_at_context += o.cases_at_context;
  AddAll(lengths, o.lengths);
  AddAll(call_sizes, o.call_sizes);
  AddAll(conversations, o.conversations);
  AddAll(ops, o.ops);
  AddAll(bigrams, o.bigrams);
  AddAll(shapes, o.shapes);
  AddAll(batches, o.batches);
  AddAll(shifts, o.shifts);
  AddAll(windows, o.windows);
  AddAll(deep, o.deep);
  for (const BoundaryCoverage& ob : o.boundaries) {
    auto it = std::find_if(boundaries.begin(), boundaries.end(),
                           [&](const BoundaryCoverage& b) { return b.size == ob.size; });
    if (it == boundaries.end()) {
      boundaries.push_back(ob);
      continue;
    }
    it->calls_at += ob.calls_at;
    it->calls_over += ob.calls_over;
    it->rows_at += ob.rows_at;
    it->rows_over += ob.rows_over;
    if (it->declared_by.empty()) it->declared_by = ob.declared_by;
  }
  std::sort(boundaries.begin(), boundaries.end(),
            [](const BoundaryCoverage& a, const BoundaryCoverage& b) { return a.size < b.size; });
}

std::vector<std::string> Coverage::Warnings() const {
  std::vector<std::string> out;
  for (const BoundaryCoverage& b : boundaries) {
    if (b.declared_by.empty()) continue;
    if (b.calls_at == 0 || b.calls_over == 0) {
      out.push_back(fmt::format(
          "warning: boundary {} (declared by {}) not crossed by a forward call: {} calls of {} or "
          "{} tokens, {} of more",
          b.size, b.declared_by, b.calls_at, b.size - 1, b.size, b.calls_over));
    }
    if (b.rows_at == 0 || b.rows_over == 0) {
      out.push_back(fmt::format(
          "warning: boundary {} (declared by {}) not crossed by a history: {} rows at position "
          "{}, {} at {} or beyond",
          b.size, b.declared_by, b.rows_at, b.size - 1, b.rows_over, b.size));
    }
  }
  return out;
}

std::string Coverage::Text() const {
  std::string out = fmt::format(
      "coverage: {} cases ({} long); longest history {} of {}, reached by {} case{}\n", cases,
      long_cases, longest, context, cases_at_context, cases_at_context == 1 ? "" : "s");
  if (!reach_limit.empty()) out += fmt::format("  reach:         {}\n", reach_limit);
  out += fmt::format("  lengths:       {}\n", Histogram(lengths));
  out += fmt::format("  call sizes:    {}\n", Histogram(call_sizes));
  std::string ops_text;
  for (const auto& [op, n] : ops)
    ops_text += fmt::format("{}{} {}", ops_text.empty() ? "" : ", ", op, n);
  out += fmt::format("  ops:           {}\n", ops_text);
  // The bigrams a campaign can make: every op after every op (8 x 8; 9 x 9 with shift steps).
  const int64_t op_kinds = shifts.empty() ? 8 : 9;
  std::vector<std::pair<int64_t, std::string>> seen;
  for (const auto& [bigram, n] : bigrams) seen.push_back({-n, bigram});
  std::sort(seen.begin(), seen.end());
  std::string rare;
  for (auto it = seen.rbegin(); it != seen.rend() && it - seen.rbegin() < 4; ++it)
    rare += fmt::format("{}{} {}", rare.empty() ? "" : ", ", it->second, -it->first);
  out += fmt::format("  op bigrams:    {} of {} seen; rarest: {}\n", bigrams.size(),
                     op_kinds * op_kinds, rare);
  std::string convs;
  for (const auto& [n, count] : conversations)
    convs += fmt::format("{}{}: {}", convs.empty() ? "" : ", ", n, count);
  out += fmt::format("  conversations: {}\n", convs);
  if (!batches.empty()) out += BatchText();
  if (!shifts.empty())
    out += ShiftText();
  else if (!shift_limit.empty())
    out += fmt::format("  shifts:        {}\n", shift_limit);
  if (!windows.empty()) out += WindowText();
  if (!deep.empty()) out += DeepText();
  // Every shape while there are few (a fixed campaign has one); with a shape per case
  // (--shapes random) the commonest kShapeLines and a count, the rest being in --json.
  constexpr size_t kShapeLines = 10;
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [shape, n] : shapes) by_count.push_back({-n, shape});
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  if (by_count.size() > kShapeLines) by_count.resize(kShapeLines);
  std::sort(by_count.begin(), by_count.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& [minus_n, shape] : by_count)
    out +=
        fmt::format("  shape:         {} ({} case{})\n", shape, -minus_n, minus_n == -1 ? "" : "s");
  if (shapes.size() > kShapeLines) {
    int64_t shown = 0;
    for (const auto& [minus_n, shape] : by_count) shown -= minus_n;
    out += fmt::format("  shapes:        {} distinct; {} more ({} cases) in --json\n",
                       shapes.size(), shapes.size() - kShapeLines, cases - shown);
  }
  out += "  boundaries (calls of b-1..b tokens / longer; rows at position b-1 / at b or beyond):\n";
  for (const BoundaryCoverage& b : boundaries) {
    out += fmt::format("    {:>5} {:<14} calls {}/{}  rows {}/{}\n", b.size,
                       b.declared_by.empty() ? "(power of 2)" : b.declared_by, b.calls_at,
                       b.calls_over, b.rows_at, b.rows_over);
  }
  for (const std::string& w : Warnings()) out += w + "\n";
  return out;
}

// "  batches:       510 calls; items 2: 90, 3: 80, ...; mix prefill 40, decode 300, mixed 170;
//  rows all 900, last 400, none 60; joined 700, left 500"
std::string Coverage::BatchText() const {
  auto get = [&](const std::string& key) {
    auto it = batches.find(key);
    return it == batches.end() ? int64_t{0} : it->second;
  };
  // By number: shorter first, so "items 10" comes after "items 9", not after "items 1".
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& [key, n] : batches)
    if (key.rfind("items ", 0) == 0) sizes.emplace_back(key.substr(6), n);
  std::stable_sort(sizes.begin(), sizes.end(),
                   [](const auto& a, const auto& b) { return a.first.size() < b.first.size(); });
  std::string items;
  for (const auto& [size, n] : sizes)
    items += fmt::format("{}{}: {}", items.empty() ? "" : ", ", size, n);
  return fmt::format(
      "  batches:       {} calls; items {}; mix prefill {}, decode {}, mixed {}; rows all {}, "
      "last {}, none {}; joined {}, left {}\n",
      get("calls"), items, get("mix prefill"), get("mix decode"), get("mix mixed"), get("rows all"),
      get("rows last"), get("rows none"), get("joined"), get("left"));
}

// "  shifts:        120 steps; keep 0 20, keep 1 18; discard 0 5; nothing after keep 30; twice
//  before a call 25; of a fork 9; then decode 60, then truncate to keep 8"
std::string Coverage::ShiftText() const {
  auto get = [&](const std::string& key) {
    auto it = shifts.find(key);
    return it == shifts.end() ? int64_t{0} : it->second;
  };
  return fmt::format(
      "  shifts:        {} steps; keep 0 {}, keep 1 {}; discard 0 {}; nothing after keep {}; "
      "twice before a call {}; of a fork {}; then decode {}, then truncate to keep {}\n",
      get("steps"), get("keep 0"), get("keep 1"), get("discard 0"), get("nothing after keep"),
      get("twice before a call"), get("of a fork"), get("then decode"),
      get("then truncate to keep"));
}

// "  windows:       200 cases, 150 crossed the window, 90 twice; calls ending at W-1..W+1 80,
//  over W 40, after a drop 900; truncates after a drop 12, forks after a drop 30"
std::string Coverage::WindowText() const {
  auto get = [&](const std::string& key) {
    auto it = windows.find(key);
    return it == windows.end() ? int64_t{0} : it->second;
  };
  return fmt::format(
      "  windows:       {} cases, {} crossed the window, {} twice; calls ending at W-1..W+1 {}, "
      "over W {}, after a drop {}; truncates after a drop {}, forks after a drop {}; no shift "
      "steps (a sliding-window conversation does not shift)\n",
      get("cases"), get("crossed"), get("twice"), get("ends at W-1..W+1"), get("over W"),
      get("after a drop"), get("truncate after a drop"), get("fork after a drop"));
}

// "  deep ops:      on conversations past 64 (256) positions: fork 40 (3) of 427, truncate 15 (1)
//  of 98, ..."
std::string Coverage::DeepText() const {
  auto get = [&](const std::string& key) {
    auto it = deep.find(key);
    return it == deep.end() ? int64_t{0} : it->second;
  };
  std::string out;
  for (const std::string what : {"fork", "truncate", "batch item", "end"}) {
    if (deep.count(what) == 0) continue;
    out += fmt::format("{}{} {} ({}) of {}", out.empty() ? "" : ", ", what, get(what + " deep"),
                       get(what + " far"), get(what));
  }
  return fmt::format("  deep ops:      on conversations past {} ({}) positions: {}\n",
                     kDeepPosition, kFarPosition, out);
}

nlohmann::json Coverage::ToJson() const {
  nlohmann::json bounds = nlohmann::json::array();
  for (const BoundaryCoverage& b : boundaries) {
    bounds.push_back({{"size", b.size},
                      {"declared_by", b.declared_by},
                      {"calls_at", b.calls_at},
                      {"calls_over", b.calls_over},
                      {"rows_at", b.rows_at},
                      {"rows_over", b.rows_over}});
  }
  nlohmann::json convs = nlohmann::json::object();
  for (const auto& [n, count] : conversations) convs[std::to_string(n)] = count;
  nlohmann::json out = {{"cases", cases},
                        {"long_cases", long_cases},
                        {"context", context},
                        {"longest", longest},
                        {"cases_at_context", cases_at_context},
                        {"lengths", HistogramJson(lengths)},
                        {"call_sizes", HistogramJson(call_sizes)},
                        {"conversations", convs},
                        {"ops", ops},
                        {"bigrams", bigrams},
                        {"shapes", shapes},
                        {"batches", batches},
                        {"shifts", shifts},
                        {"deep", deep},
                        {"boundaries", bounds},
                        {"reach_limit", reach_limit},
                        {"shift_limit", shift_limit},
                        {"warnings", Warnings()}};
  if (!windows.empty()) out["windows"] = windows;  // only a windowed model's reports have them
  return out;
}

}  // namespace kvdiff::harness
