#include "harness/scenario/driver_kind.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "format/error.h"

namespace kvdiff::harness {
namespace {

struct DriverKindInfo {
  DriverKind kind;
  const char* name;
  const char* what;
};

constexpr DriverKindInfo kDriverKinds[] = {
    {DriverKind::kSession, "session",
     "the checked API: one session per conversation, no position anywhere"},
    {DriverKind::kUncached, "uncached",
     "no cache: every call recomputes ForwardFull of the whole history"},
    {DriverKind::kRaw, "raw",
     "the raw call used right: the caller tracks index_pos, a new cache per conversation"},
    {DriverKind::kPos0, "pos0", "the raw call with index_pos 0 on every call"},
    {DriverKind::kReuse, "reuse",
     "a new conversation reuses the previous one's cache from index_pos 0; reset never clears"},
    {DriverKind::kQuantized, "quantized",
     "reuse on candle's quantized_llama, which drops its cache when index_pos is 0"},
    {DriverKind::kStalePosition, "stale-position",
     "a new conversation gets a fresh cache, but index_pos carries on from the previous one"},
};

const DriverKindInfo& KindInfo(DriverKind kind) {
  for (const DriverKindInfo& k : kDriverKinds)
    if (k.kind == kind) return k;
  throw std::logic_error("unknown DriverKind");
}

}  // namespace

std::vector<DriverKind> AllDriverKinds() {
  std::vector<DriverKind> kinds;
  for (const DriverKindInfo& k : kDriverKinds) kinds.push_back(k.kind);
  return kinds;
}

std::string DriverName(DriverKind kind) { return KindInfo(kind).name; }
std::string DriverWhat(DriverKind kind) { return KindInfo(kind).what; }

DriverKind ParseDriverName(const std::string& name) {
  std::vector<std::string> names;
  for (const DriverKindInfo& k : kDriverKinds) {
    if (name == k.name) return k.kind;
    names.push_back(k.name);
  }
  throw InputError(fmt::format("driver: unknown driver \"{}\" (expected one of {})", name,
                               fmt::join(names, ", ")));
}

}  // namespace kvdiff::harness
