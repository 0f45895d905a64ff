// What golden_format.cc, golden_regen.cc and golden_verify.cc share and nothing else uses: reading
// files, building a golden from a recording, its rows file, and the digests' tolerances.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "harness/golden/golden.h"
#include "harness/replay/replay.h"

namespace kvdiff::harness::golden_detail {

std::string ReadBytes(const std::filesystem::path& path);  // InputError when unreadable

// The header regen writes for this scenario, made with `backend` (no rows).
Golden GoldenHeader(const GoldenPaths& paths, const GoldenInput& in, const std::string& backend);
// InputError, naming `where`, the field and both values, unless every recorded header field but
// kvdiff_version equals the expected one.
void CheckGoldenHeader(const Golden& recorded, const Golden& expected, const std::string& where);
// A golden of the recording's rows (every row summarized, each conversation's last row whole).
Golden MakeGolden(const GoldenPaths& paths, const GoldenInput& in, const Recording& rec,
                  const std::string& backend);
// The rows file's bytes (deterministic), built in a scratch folder before anything is written.
std::string RowsFileBytes(const Golden& golden);
// Loads the full rows a golden names from its rows file; InputError when absent or malformed.
void LoadFullRows(Golden& golden, const std::filesystem::path& rows_path);
// "step 2 row 1"
std::string Where(const GoldenRow& row);

// If every logit is within tol of the golden's, these bounds hold for the row's digests.
struct DigestTolerance {
  double sum, sum_sq, max;  // max and min alike
};
DigestTolerance DigestTolerances(double tol, int64_t vocab, double golden_sum_sq);

}  // namespace kvdiff::harness::golden_detail
