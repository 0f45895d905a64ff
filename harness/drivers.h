// Drivers: how one backend's caches are driven through a scenario's conversations. The session
// driver uses the checked API (Backend::NewSession); the misuse drivers reproduce the seed's bugs
// on the raw calls, which the Backend interface deliberately hides, so they are built directly on
// impl::Model::Forward(tokens, index_pos, cache) and ref::ReferenceModel::Forward(tokens, cache).
#pragma once

#include <memory>
#include <string>

#include "harness/backend.h"
#include "format/model_files.h"
#include "format/tensor.h"
#include "harness/scenario.h"

namespace kvdiff::harness {

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
};

// Whether `kind` can drive backend `backend_name`: pos0 needs a position argument, which only
// impl's raw call has (transformers' forward takes none). Returns an empty string when it
// applies, else the reason.
std::string DriverNotApplicable(DriverKind kind, const std::string& backend_name);

// backend: the checked backend (used by the session driver). weights/threads: the raw models of
// the misuse drivers share these weights (no copies). Throws InputError when not applicable.
std::unique_ptr<Driver> MakeDriver(DriverKind kind, const Backend& backend,
                                   std::shared_ptr<const format::ModelWeights> weights,
                                   int threads);

}  // namespace kvdiff::harness
