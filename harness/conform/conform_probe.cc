// The Probe every conform check is written with (conform_detail.h).
#include <algorithm>

#include "format/error.h"
#include "format/prng.h"
#include "harness/compare/compare.h"
#include "harness/compare/tolerance_profile.h"
#include "harness/conform/conform_detail.h"

namespace kvdiff::harness::conform_detail {

Probe::Probe(const Backend& engine, const Backend& oracle, double tolerance,
             double rope_f32_per_position, uint64_t seed)
    : engine_(engine),
      oracle_(oracle),
      tolerance_(tolerance),
      rope_f32_per_position_(rope_f32_per_position),
      rng_(seed) {}

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

void Probe::ExpectOracleRows(const Tokens& history, const Logits& got,
                             const std::vector<int64_t>& positions, const std::string& what) {
  const Logits want = oracle_.ForwardFull(history, nullptr);
  for (size_t r = 0; r < positions.size(); ++r) {
    const int64_t position = positions[r];
    const auto row = static_cast<int64_t>(r);
    const std::string nonfinite = DescribeNonFinite(got.row(row).data(), vocab());
    if (!nonfinite.empty())
      Fail("{}: position {}: non-finite logits: {}", what, position, nonfinite);
    const double tolerance = CrossTolerance(tolerance_, rope_f32_per_position_, engine_.Info(),
                                            oracle_.Info(), position);
    const RowComparison cmp =
        CompareRows(got.row(row).data(), want.row(position).data(), vocab(), tolerance);
    worst_ = std::max(worst_, cmp.max_abs_diff);
    ++rows_;
    if (!cmp.within_tolerance) {
      Fail(
          "{}: position {} differs from {}'s uncached forward by {:.3e} > {:.3e} (argmax {} "
          "vs {})",
          what, position, oracle_.Name(), cmp.max_abs_diff, tolerance, cmp.argmax_a, cmp.argmax_b);
    }
  }
}

void Probe::ExpectLength(const Conversation& c, const std::string& what) const {
  const int64_t length = c.session->Length();
  if (length != static_cast<int64_t>(c.history.size())) {
    Fail("{}: Length() is {}, expected {}", what, length, c.history.size());
  }
}

void Probe::ExpectRefused(Conversation& c, const std::string& what,
                          const std::function<void()>& call) {
  try {
    call();
  } catch (const InputError& e) {
    ExpectLength(c, what + " (after the refusal)");
    Append(c, RandomTokens(2), what + ", then an append");
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

std::string Refused(const Probe& p) {
  std::string m = p.LastRefusal();
  if (m.size() > 70) m = m.substr(0, 67) + "...";
  return "refused: " + m;
}

}  // namespace kvdiff::harness::conform_detail
