// Drivers: how one backend's caches are driven through a scenario's conversations. The session
// driver uses the checked API (Backend::NewSession); the uncached driver recomputes ForwardFull of
// the whole history on every call (the source document's check); the raw drivers make the calls a
// port makes on the raw API (Backend::Raw), correctly (`raw`) or in the ways the seed's bugs do.
// Every driver is written once, against the Backend interface: none knows which backend it holds.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/tensor.h"
#include "harness/backend/backend.h"

namespace kvdiff::harness {

enum class DriverKind {
  kSession,        // the checked API: Backend::NewSession(), no position anywhere
  kUncached,       // no cache: every call is ForwardFull of the conversation's whole history
  kRaw,            // the raw call, used right: the caller tracks index_pos, a new cache per
                   // conversation, reset clears the cache
  kPos0,           // the raw call with index_pos 0 on every call (seed: pos0)
  kReuse,          // a new conversation reuses the previous conversation's cache from index_pos
                   // 0, and reset never clears it (seed: reuse, reuse1; llama.rs has no clear)
  kQuantized,      // reuse on candle's quantized_llama, which drops its cache when index_pos is 0
  kStalePosition,  // a new conversation gets a fresh cache but index_pos carries on from the
                   // previous conversation (seed: "cannot broadcast [13, 45] to [1, 9, 13, 13]")
};
std::vector<DriverKind> AllDriverKinds();
std::string DriverName(DriverKind kind);
std::string DriverWhat(DriverKind kind);           // one line, for help texts and reports
DriverKind ParseDriverName(const std::string& name);  // InputError listing the known names

// Whether `kind` can drive a backend described by `info`: the raw drivers need a raw call, pos0
// and stale-position one that takes a position. Empty when it applies, else the reason.
std::string DriverNotApplicable(DriverKind kind, const BackendInfo& info);

class Driver {
 public:
  virtual ~Driver() = default;
  // Conversation names are checked by ValidateScenario before a run; these assume they exist.
  virtual void NewConversation(const std::string& name) = 0;
  virtual Logits Append(const std::string& conversation, const Tokens& tokens,
                        ForwardTrace* trace) = 0;
  virtual void Truncate(const std::string& conversation, int64_t length) = 0;
  virtual void Fork(const std::string& from, const std::string& to) = 0;
  virtual void Reset(const std::string& conversation) = 0;
  // The number of positions the backend says the conversation holds (the session's Length()),
  // which the replay holds to what it fed after every call; nullopt for the misuse drivers, whose
  // caches are meant to hold what the conversation does not (reuse, pos0, stale-position).
  virtual std::optional<int64_t> Length(const std::string& conversation) const = 0;
};

// A driver with conversation "main" open. InputError when `kind` does not apply to the backend.
std::unique_ptr<Driver> MakeDriver(DriverKind kind, const Backend& backend);

}  // namespace kvdiff::harness
