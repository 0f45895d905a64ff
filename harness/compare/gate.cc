// The gate of a run (gate.h).
#include "harness/compare/gate.h"

#include "harness/compare/tolerance_profile.h"

namespace kvdiff::harness {

Tolerance Gate::Across(const BackendInfo& a, const BackendInfo& b, int64_t position) const {
  const bool f32_angles = a.rope_angles == "f32" || b.rope_angles == "f32";
  return {f32_angles ? abs + rope_f32_per_position * static_cast<double>(position) : abs, rel,
          kl_max};
}

Gate ResolveGate(const std::optional<double>& flag, const Gate& from_file,
                 const std::vector<const Backend*>& backends, std::vector<std::string>* notes) {
  Gate gate;
  std::string profile_note, rope_note;
  gate.abs = ResolveRunTolerance(flag, from_file.abs, backends, &profile_note);
  gate.rel = from_file.rel;
  gate.kl_max = ResolveKlGate(flag, backends);
  gate.own_abs = ResolveOwnGate(flag, backends);
  gate.rope_f32_per_position = ResolveRopeAllowance(flag, backends, &rope_note);
  for (std::string* note : {&profile_note, &rope_note}) {
    if (!note->empty()) notes->push_back(std::move(*note));
  }
  return gate;
}

}  // namespace kvdiff::harness
