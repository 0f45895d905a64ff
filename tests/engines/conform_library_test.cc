// `RunConformance`, the library call behind `kvdiff conform`, on impl and on wrong in-process
// backends: the suite needs nothing but the Backend interface. impl passes against itself; a
// backend with no batched call passes the batch checks through Backend::AppendBatch's default;
// rows mapped to the wrong items fail the batch checks only; a truncate or shift beyond the length
// that is not refused (or whose refusal changes the session) fails its check; the shift check is
// skipped (saying why) with nothing to arbitrate, and the capacity check above its fill limit; an
// engine that declares limits is held to them: a correct one passes with the checks beyond them
// skipped, one that holds more positions than it declares fails the capacity check.
// `kvdiff conform` through the binary is in conform_cli_test.cc.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/conform/conform.h"
#include "harness/run/differential_run.h"
#include "tests/engines/conform_table.h"
#include "tests/harness/harness_test_util.h"
#include "tests/harness/wrapped_backend.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The tiny model, impl on it (the oracle, or the engine, of every test), and conformance without
// its campaign; Impl() makes another impl for a test's wrong backend to wrap.
class Conform : public ::testing::Test {
 protected:
  std::unique_ptr<harness::Backend> Impl() const {
    return harness::MakeBackend("impl", weights_, 1);
  }
  static harness::BackendInfo Named(std::string name) {
    harness::BackendInfo info;
    info.name = std::move(name);
    return info;
  }
  harness::ConformReport Run(const harness::Backend& engine, const harness::Backend& oracle) const {
    return harness::RunConformance(model_, engine, oracle, options_);
  }

  const harness::ModelSpec model_ = testing::TinyModel();
  const std::shared_ptr<const format::ModelWeights> weights_ = harness::LoadModelFor(model_);
  const std::unique_ptr<harness::Backend> impl_ = Impl();
  harness::ConformOptions options_ = [] {
    harness::ConformOptions options;
    options.campaign_cases = 0;
    return options;
  }();
};

// impl through the library call: the suite needs nothing but the Backend interface.
TEST_F(Conform, ImplConformsAgainstItself) {
  options_.campaign_cases = 10;
  const TempDir failures;  // lives until the run is over, then takes its files with it
  options_.out_dir = failures / "failures";
  const harness::ConformReport report = Run(*impl_, *impl_);
  EXPECT_TRUE(report.Passed()) << report.Table();
  EXPECT_EQ(report.checks.size(), 22u);
  // No arbiter given: impl, the oracle, shifts and arbitrates (its own shift, bit for bit).
  EXPECT_THAT(RowOf("\n" + report.Table(), "shift"),
              HasSubstr("10 rows after a shift against impl, max |a-b| 0.0e+00"));
}

// impl without its batched forward: Backend::AppendBatch's default runs the items one after
// another, and refuses what a session would refuse halfway before the first item runs, so a
// backend with no batched call of its own passes the batch checks, refusals included.
class OneAfterAnother : public WrappedBackend {
 public:
  using WrappedBackend::WrappedBackend;
};

// impl's batched forward with a serving engine's bug: the first rows of items 0 and 1 change
// places (outputs mapped back to the wrong items).
class RowsSwapped : public OneAfterAnother {
 public:
  using OneAfterAnother::OneAfterAnother;
  std::vector<Logits> AppendBatch(const std::vector<harness::BatchItem>& items) const override {
    std::vector<Logits> out = inner().AppendBatch(items);
    if (out.size() >= 2 && out[0].rows() > 0 && out[1].rows() > 0) {
      const Eigen::RowVectorXf first = out[0].row(0);
      out[0].row(0) = out[1].row(0);
      out[1].row(0) = first;
    }
    return out;
  }
};

TEST_F(Conform, ABackendWithoutABatchedCallConformsThroughTheDefault) {
  const OneAfterAnother serial(Impl(), Named("serial"));
  const harness::ConformReport report = Run(serial, *impl_);
  EXPECT_TRUE(report.Passed()) << report.Table();
  EXPECT_THAT(RowOf("\n" + report.Table(), "batch-refusals"),
              HasSubstr("4 batches refused: backend serial: batch item 1: token id 256"));
}

// The batch checks fail, and so do the edge checks that make batched calls (after a reset, many
// sessions, at a long history; after-shift is skipped: the wrapper does not shift); no other.
TEST_F(Conform, RowsMappedToTheWrongItemsFailTheChecksWithBatchedCallsOnly) {
  const RowsSwapped swapped(Impl(), Named("swapped"));
  const harness::ConformReport report = Run(swapped, *impl_);
  const std::string table = "\n" + report.Table();
  EXPECT_THAT(RowOf(table, "batch"),
              HasSubstr("FAIL   batch 1 (a:decode, b:7/last, c:3/none, twin:decode, e:4), item 0 "
                        "of 5: position 10 differs from impl's uncached forward"));
  for (const char* check : {"batch-fork-truncate", "after-reset", "many-sessions", "long-history"})
    EXPECT_THAT(RowOf(table, check), HasSubstr("FAIL")) << check;
  EXPECT_EQ(report.Failures(), 5) << report.Table();
}

// impl's sessions with a misuse of truncate beyond the length: clamped to the length (a silent
// "fix", no refusal), or refused after forgetting a position (a refusal that changes the session).
class BadTruncate : public OneAfterAnother {
 public:
  enum class How { kClamp, kRefuseAfterForgetting };
  BadTruncate(std::unique_ptr<harness::Backend> inner, harness::BackendInfo info, How how)
      : OneAfterAnother(std::move(inner), std::move(info)), how_(how) {}
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    return std::make_unique<Session>(inner().NewSession(), how_);
  }

 private:
  class Session : public harness::BackendSession {
   public:
    Session(std::unique_ptr<harness::BackendSession> inner, How how)
        : inner_(std::move(inner)), how_(how) {}
    Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
      return inner_->Append(tokens, trace);
    }
    int64_t Length() const override { return inner_->Length(); }
    void Truncate(int64_t length) override {
      if (length <= inner_->Length()) return inner_->Truncate(length);
      if (how_ == How::kClamp) return;
      inner_->Truncate(inner_->Length() - 1);
      throw kvdiff::InputError("truncate beyond the length");
    }
    std::unique_ptr<harness::BackendSession> Fork() const override {
      return std::make_unique<Session>(inner_->Fork(), how_);
    }
    void Reset() override { inner_->Reset(); }

   private:
    std::unique_ptr<harness::BackendSession> inner_;
    How how_;
  };
  How how_;
};

TEST_F(Conform, ABadCallThatIsNotRefusedOrChangesTheSessionFailsItsCheck) {
  const BadTruncate clamp(Impl(), Named("clamp"), BadTruncate::How::kClamp);
  const harness::ConformReport clamped = Run(clamp, *impl_);
  EXPECT_EQ(clamped.Failures(), 1) << clamped.Table();
  EXPECT_THAT(RowOf("\n" + clamped.Table(), "truncate-beyond"),
              HasSubstr("FAIL   truncate to 6 of 5: expected a refusal as bad input, but the call "
                        "succeeded"));
  const BadTruncate forget(Impl(), Named("forget"), BadTruncate::How::kRefuseAfterForgetting);
  const harness::ConformReport forgot = Run(forget, *impl_);
  EXPECT_EQ(forgot.Failures(), 1) << forgot.Table();
  EXPECT_THAT(RowOf("\n" + forgot.Table(), "truncate-beyond"),
              HasSubstr("FAIL   truncate to 6 of 5: Length() is 4 after the refusal, expected 5"));
}

// impl's sessions with a shift that ignores bad arguments instead of refusing them (a silent
// "fix"): the shift-beyond check fails naming the first such call, and nothing else.
class LaxShift : public OneAfterAnother {
 public:
  using OneAfterAnother::OneAfterAnother;
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    return std::make_unique<Session>(inner().NewSession());
  }

 private:
  class Session : public harness::BackendSession {
   public:
    explicit Session(std::unique_ptr<harness::BackendSession> inner) : inner_(std::move(inner)) {}
    Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
      return inner_->Append(tokens, trace);
    }
    int64_t Length() const override { return inner_->Length(); }
    void Truncate(int64_t length) override { inner_->Truncate(length); }
    std::unique_ptr<harness::BackendSession> Fork() const override {
      return std::make_unique<Session>(inner_->Fork());
    }
    void Reset() override { inner_->Reset(); }
    void Shift(int64_t keep, int64_t discard) override {
      if (keep < 0 || discard < 0 || keep > Length() || discard > Length() - keep) return;
      inner_->Shift(keep, discard);
    }

   private:
    std::unique_ptr<harness::BackendSession> inner_;
  };
};

TEST_F(Conform, AShiftThatIgnoresBadArgumentsFailsTheShiftBeyondCheckOnly) {
  harness::BackendInfo info = Named("lax");
  info.shifts = true;
  const LaxShift lax(Impl(), info);
  const harness::ConformReport report = Run(lax, *impl_);
  EXPECT_EQ(report.Failures(), 1) << report.Table();
  const std::string table = "\n" + report.Table();
  EXPECT_THAT(RowOf(table, "shift-beyond"),
              HasSubstr("FAIL   shift(keep=-1, discard=1) of 5: expected a refusal as bad input, "
                        "but the call succeeded"));
  EXPECT_THAT(RowOf(table, "shift"), HasSubstr("PASS   10 rows after a shift against impl"));
}

// An engine that shifts, held to an oracle that does not and given no arbiter: nothing can judge
// its rows after a shift, so the shift check is skipped saying why; its refusals still run.
TEST_F(Conform, TheShiftCheckIsSkippedWithNothingToArbitrate) {
  const OneAfterAnother oracle(Impl(), Named("no-shift"));
  const harness::ConformReport report = Run(*impl_, oracle);
  EXPECT_TRUE(report.Passed()) << report.Table();
  EXPECT_EQ(report.shift_arbiter, "");
  EXPECT_THAT(RowOf("\n" + report.Table(), "shift"),
              HasSubstr("skip   nothing to hold rows after a shift to: no arbiter (kvdiff "
                        "conform makes ref64 when LibTorch is built) and the oracle does not "
                        "shift"));
  EXPECT_THAT(RowOf("\n" + report.Table(), "shift-beyond"), HasSubstr("PASS   refused: "));
}

TEST_F(Conform, TheCapacityCheckIsSkippedAboveItsFillLimitSayingWhy) {
  options_.max_capacity_fill = 100;
  const harness::ConformReport report = Run(*impl_, *impl_);
  EXPECT_TRUE(report.Passed()) << report.Table();
  EXPECT_EQ(report.checks.size(), 21u);
  EXPECT_THAT(RowOf("\n" + report.Table(), "capacity"),
              HasSubstr("skip   max_position_embeddings 512 is above the fill limit 100"));
}

// impl declaring that a session holds 20 positions while it holds 512: the capacity check fills
// what the engine declares and finds the 21st position taken, not refused; the checks that need
// more than 20 positions are skipped, naming the limit.
TEST_F(Conform, AnEngineThatHoldsMoreThanItDeclaresFailsTheCapacityCheckOnly) {
  harness::BackendInfo info = Named("declares-20");
  info.max_length = 20;
  const OneAfterAnother engine(Impl(), info);
  const harness::ConformReport report = Run(engine, *impl_);
  EXPECT_EQ(report.Failures(), 1) << report.Table();
  const std::string table = "\n" + report.Table();
  EXPECT_THAT(RowOf(table, "capacity"),
              HasSubstr("FAIL   position 20 (max_length 20): expected a refusal as bad input, but "
                        "the call succeeded"));
  EXPECT_THAT(RowOf(table, "prefill"), HasSubstr("PASS   20 rows"));
  EXPECT_THAT(RowOf(table, "chunks"),
              HasSubstr("skip   the check needs more than the engine holds: steps[6] "
                        "prefill(main,n=1): conversation \"main\" would reach 21 positions, more "
                        "than backend declares-20 holds (max_length 20)"));
}

// impl behind the limits it declares: two sessions alive at once, eight tokens a call, each
// refused beyond as bad input, as a serving engine sized for its machine refuses. A correct engine
// with limits passes: a long append is made in calls of eight, the checks that need a third
// session (the batch checks) are skipped saying so, and the others (fork and shift included, which
// free each conversation when done) run; the batch refusals need no third session.
class Limited : public OneAfterAnother {
 public:
  Limited(std::unique_ptr<harness::Backend> inner, harness::BackendInfo info)
      : OneAfterAnother(std::move(inner), std::move(info)) {}
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    return Admit(inner().NewSession());
  }
  // Its uncached forward is one call too (a plugin's: a new session and one append).
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    CheckCall(tokens);
    return inner().ForwardFull(tokens, trace);
  }

 private:
  void CheckCall(const Tokens& tokens) const {
    const int64_t limit = Info().max_batch_tokens;
    if (limit > 0 && static_cast<int64_t>(tokens.size()) > limit)
      throw kvdiff::InputError(fmt::format("{} tokens in one call (max {})", tokens.size(), limit));
  }
  class Session : public harness::BackendSession {
   public:
    Session(const Limited& owner, std::unique_ptr<harness::BackendSession> inner)
        : owner_(owner), inner_(std::move(inner)) {}
    ~Session() override { --owner_.alive_; }
    Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
      owner_.CheckCall(tokens);
      return inner_->Append(tokens, trace);
    }
    int64_t Length() const override { return inner_->Length(); }
    void Truncate(int64_t length) override { inner_->Truncate(length); }
    std::unique_ptr<harness::BackendSession> Fork() const override {
      return owner_.Admit(inner_->Fork());
    }
    void Reset() override { inner_->Reset(); }
    void Shift(int64_t keep, int64_t discard) override { inner_->Shift(keep, discard); }

   private:
    const Limited& owner_;
    std::unique_ptr<harness::BackendSession> inner_;
  };
  std::unique_ptr<harness::BackendSession> Admit(
      std::unique_ptr<harness::BackendSession> inner) const {
    if (Info().max_sessions > 0 && alive_ == Info().max_sessions)
      throw kvdiff::InputError(fmt::format("all {} sessions are in use", alive_));
    ++alive_;
    return std::make_unique<Session>(*this, std::move(inner));
  }
  mutable int64_t alive_ = 0;
};

TEST_F(Conform, ACorrectEngineWithDeclaredLimitsPassesWithTheChecksBeyondThemSkipped) {
  harness::BackendInfo info = Named("limited");
  info.max_sessions = 2;
  info.max_batch_tokens = 8;
  info.shifts = true;
  const Limited engine(Impl(), info);
  options_.campaign_cases = 10;
  const TempDir failures;
  options_.out_dir = failures / "failures";
  const harness::ConformReport report = Run(engine, *impl_);
  EXPECT_TRUE(report.Passed()) << report.Table();
  const std::string table = "\n" + report.Table();
  // The prefill of 24 and capacity's chunks of 128 pass only as calls of at most eight; the
  // campaign's rows of histories longer than eight have no uncached forward of the engine's own
  // (it would be refused: the campaign failed so before) and are held to impl's.
  for (const char* check : {"prefill", "fork", "sessions", "capacity", "shift", "campaign"})
    EXPECT_THAT(RowOf(table, check), HasSubstr("PASS")) << check << table;
  EXPECT_THAT(RowOf(table, "capacity"), HasSubstr("512 positions held"));
  EXPECT_THAT(RowOf(table, "batch"),
              HasSubstr("skip   a batch of two conversations and an item alone need 3 sessions at "
                        "once; the engine holds 2 (max_sessions)"));
  EXPECT_THAT(table, HasSubstr("PASS: 19 of 22 checks passed, 0 failed, 3 skipped"));
}

// With three or four sessions (a server's slots) the batch checks run on batches of two or three
// conversations, saying so: a correct engine passes them, rows mapped to the wrong items fail them.
TEST_F(Conform, TheBatchChecksFitTheSessionsAnEngineHolds) {
  for (const int64_t sessions : {3, 4}) {
    harness::BackendInfo info = Named("slots");
    info.max_sessions = sessions;
    const Limited engine(Impl(), info);
    const harness::ConformReport report = Run(engine, *impl_);
    EXPECT_TRUE(report.Passed()) << report.Table();
    const std::string note =
        fmt::format("; {} conversations a call (max_sessions {})", sessions - 1, sessions);
    for (const char* check : {"batch", "batch-fork-truncate"}) {
      EXPECT_THAT(RowOf("\n" + report.Table(), check), HasSubstr("PASS")) << check;
      EXPECT_THAT(RowOf("\n" + report.Table(), check), HasSubstr(note)) << check;
    }
    info.name = "swapped";
    const RowsSwapped swapped(Impl(), info);
    const harness::ConformReport wrong = Run(swapped, *impl_);
    const std::string table = "\n" + wrong.Table();
    EXPECT_THAT(RowOf(table, "batch"), HasSubstr("FAIL   batch 1 (a:decode, b:7/last")) << table;
    EXPECT_THAT(RowOf(table, "batch-fork-truncate"), HasSubstr("FAIL")) << table;
    EXPECT_EQ(wrong.Failures(), 4) << table;  // and after-reset's and long-history's batches
  }
  // Six sessions hold the whole batch and its item alone: nothing is cut, nothing said.
  harness::BackendInfo info = Named("six");
  info.max_sessions = 6;
  const Limited six(Impl(), info);
  const harness::ConformReport report = Run(six, *impl_);
  EXPECT_TRUE(report.Passed()) << report.Table();
  EXPECT_THAT(report.Table(), Not(HasSubstr("conversations a call"))) << report.Table();
}

}  // namespace
}  // namespace kvdiff::testing
