// The Probe every conform check is written with (conform_detail.h).
#include <algorithm>

#include "format/error.h"
#include "format/prng.h"
#include "harness/compare/compare.h"
#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {

Probe::Probe(const Backend& engine, const Backend& oracle, const Gate& gate, uint64_t seed)
    : engine_(engine), oracle_(oracle), gate_(gate), rng_(seed) {}

Probe::Conversation Probe::New() const {
  Conversation c{engine_.NewSession(), {}};
  ExpectLength(c, "a new session");
  return c;
}

Probe::Conversation Probe::Fork(const Conversation& c, const std::string& what) const {
  Conversation fork{c.session->Fork(), c.history};
  ExpectLength(fork, what);
  ExpectLength(c, "the parent of " + what);
  return fork;
}

Tokens Probe::RandomTokens(int64_t n) {
  Tokens t(n);
  for (Token& token : t) token = static_cast<Token>(format::SplitMix64(rng_) % vocab());
  return t;
}

Logits Probe::Append(Conversation& c, const Tokens& tokens, const std::string& what) {
  Logits got = c.session->Append(tokens, nullptr);
  c.history.insert(c.history.end(), tokens.begin(), tokens.end());
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (got.rows() != n || got.cols() != vocab()) {
    Fail("{}: expected logits [{}, {}], got [{}, {}]", what, n, vocab(), got.rows(), got.cols());
  }
  ExpectLength(c, what);
  std::vector<int64_t> positions;
  const auto end = static_cast<int64_t>(c.history.size());
  for (int64_t p = end - n; p < end; ++p) positions.push_back(p);
  ExpectOracleRows(c.history, got, positions, what);
  return got;
}

std::vector<Logits> Probe::AppendBatch(const std::vector<BatchPart>& parts,
                                       const std::string& what) {
  std::vector<BatchItem> items;
  for (const BatchPart& part : parts)
    items.push_back({part.conversation->session.get(), part.tokens, part.output});
  const std::vector<Logits> out = engine_.AppendBatch(items);
  if (out.size() != parts.size())
    Fail("{}: {} items returned {} blocks of logits", what, parts.size(), out.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    Conversation& c = *parts[k].conversation;
    const std::string item = fmt::format("{}, item {} of {}", what, k, parts.size());
    const int64_t rows = items[k].OutputRows();
    if (out[k].rows() != rows || out[k].cols() != vocab()) {
      Fail("{}: expected logits [{}, {}] (its flagged rows), got [{}, {}]", item, rows, vocab(),
           out[k].rows(), out[k].cols());
    }
    std::vector<int64_t> positions;
    for (size_t t = 0; t < items[k].tokens.size(); ++t)
      if (items[k].Outputs(t)) positions.push_back(static_cast<int64_t>(c.history.size() + t));
    c.history.insert(c.history.end(), parts[k].tokens.begin(), parts[k].tokens.end());
    ExpectLength(c, item);
    if (rows > 0) ExpectOracleRows(c.history, out[k], positions, item);
  }
  return out;
}

void Probe::ExpectOracleRows(const Tokens& history, const Logits& got,
                             const std::vector<int64_t>& positions, const std::string& what) {
  const Logits want = oracle_.ForwardFull(history, nullptr);
  for (size_t r = 0; r < positions.size(); ++r) {
    const int64_t position = positions[r];
    const auto row = static_cast<int64_t>(r);
    const std::string nonfinite = DescribeNonFinite(got.row(row).data(), vocab());
    if (!nonfinite.empty())
      Fail("{}: position {}: non-finite logits: {}", what, position, nonfinite);
    const Tolerance tolerance = gate_.Across(engine_.Info(), oracle_.Info(), position);
    const RowComparison cmp =
        CompareRows(got.row(row).data(), want.row(position).data(), vocab(), tolerance);
    worst_ = std::max(worst_, cmp.max_abs_diff);
    ++rows_;
    if (!cmp.within_tolerance) {
      Fail(
          "{}: position {} differs from {}'s uncached forward by {:.3e} > {:.3e} (argmax {} "
          "vs {})",
          what, position, oracle_.Name(), cmp.max_abs_diff, tolerance.abs, cmp.argmax_a,
          cmp.argmax_b);
    }
  }
}

void Probe::ExpectSameRows(const Logits& got, const Logits& want,
                           const std::vector<int64_t>& positions, const std::string& what) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    Fail("{}: logits [{}, {}] against [{}, {}]", what, got.rows(), got.cols(), want.rows(),
         want.cols());
  }
  for (int64_t r = 0; r < got.rows(); ++r) {
    // Both rows are the engine's own, its RoPE angles alike: the run's gate without allowance.
    const RowComparison cmp =
        CompareRows(got.row(r).data(), want.row(r).data(), vocab(), gate_.Own());
    same_worst_ = std::max(same_worst_, cmp.max_abs_diff);
    ++same_rows_;
    if (!cmp.within_tolerance) {
      Fail("{}: position {}: max |a-b| {:.3e} > {:.3e} (argmax {} vs {})", what, positions[r],
           cmp.max_abs_diff, gate_.abs, cmp.argmax_a, cmp.argmax_b);
    }
  }
}

void Probe::ExpectLength(const Conversation& c, const std::string& what) const {
  const int64_t length = c.session->Length();
  if (length != static_cast<int64_t>(c.history.size())) {
    Fail("{}: Length() is {}, expected {}", what, length, c.history.size());
  }
}

void Probe::ExpectRefused(const std::vector<Conversation*>& unchanged, const std::string& what,
                          const std::function<void()>& call) {
  try {
    call();
  } catch (const InputError& e) {
    for (Conversation* c : unchanged) {
      ExpectLength(*c, what + " (after the refusal)");
      Append(*c, RandomTokens(2), what + ", then an append");
    }
    refusals_.push_back(e.what());
    return;
  } catch (const EngineError& e) {
    Fail("{}: expected a refusal as bad input, got an engine failure: {}", what, e.what());
  }
  Fail("{}: expected a refusal as bad input, but the call succeeded", what);
}

std::string Probe::Figures() {
  std::string s = fmt::format("{} rows, max |a-b| {:.1e}", rows_, worst_);
  rows_ = 0;
  worst_ = 0;
  return s;
}

std::string Probe::SameRowsFigure() {
  std::string s = fmt::format("max |a-b| {:.1e} over {} rows", same_worst_, same_rows_);
  same_rows_ = 0;
  same_worst_ = 0;
  return s;
}

std::string Refused(const Probe& p) {
  std::string m = p.LastRefusal();
  if (m.size() > 70) m = m.substr(0, 67) + "...";
  return "refused: " + m;
}

}  // namespace kvdiff::harness::conform_detail
