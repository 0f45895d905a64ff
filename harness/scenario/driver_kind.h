// The drivers a scenario can name ("driver": "pos0"): which way the replay drives a backend's
// caches (harness/replay/drivers.h implements each one). A scenario file only names its driver,
// so the names live with the scenario and the replay depends on them, not the other way round.
#pragma once

#include <string>
#include <vector>

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
std::string DriverWhat(DriverKind kind);              // one line, for help texts and reports
DriverKind ParseDriverName(const std::string& name);  // InputError listing the known names

}  // namespace kvdiff::harness
