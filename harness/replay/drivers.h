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
#include "harness/scenario/driver_kind.h"

namespace kvdiff::harness {

// Whether `kind` can drive a backend described by `info`: the raw drivers need a raw call, pos0
// and stale-position one that takes a position. Empty when it applies, else the reason.
std::string DriverNotApplicable(DriverKind kind, const BackendInfo& info);

// One conversation's part of a batch step's call.
struct DriverBatchItem {
  std::string conversation;
  Tokens tokens;
  std::vector<bool> output;  // per token: its row is returned (BatchItem::output)
};

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
  // A context shift of the conversation (BackendSession::Shift). Only the session driver has one
  // (ValidateScenario refuses shift steps under any other); the default throws InputError.
  virtual void Shift(const std::string& conversation, int64_t keep, int64_t discard);
  // The conversation's session (or cache) is freed; the name may be created again.
  virtual void End(const std::string& conversation) = 0;
  // A batch step: every item in one call where the driver can make one (the session driver, via
  // Backend::AppendBatch); per item, the rows asked for. The default appends the items one after
  // another (the uncached and raw drivers, which have no batched call to make).
  virtual std::vector<Logits> AppendBatch(const std::vector<DriverBatchItem>& items);
  // The number of positions the backend says the conversation holds (the session's Length()),
  // which the replay holds to what it fed after every call; nullopt for the misuse drivers, whose
  // caches are meant to hold what the conversation does not (reuse, pos0, stale-position).
  virtual std::optional<int64_t> Length(const std::string& conversation) const = 0;
};

// A driver with conversation "main" open. InputError when `kind` does not apply to the backend.
std::unique_ptr<Driver> MakeDriver(DriverKind kind, const Backend& backend);

}  // namespace kvdiff::harness
