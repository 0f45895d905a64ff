// This machine's physical memory, for the refusals of inputs that would ask for more than it has
// (a random model's weights, the KV cache of a scenario's live conversations) before anything is
// allocated: a small file must not be able to take the machine down.
#pragma once

#include <unistd.h>

namespace kvdiff::format {

// In bytes; 0 when the system does not say (the callers then refuse nothing).
inline double PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

}  // namespace kvdiff::format
