// Reports of a run: the terminal table, JSON for machines, JUnit XML for CI systems.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/run/differential_run.h"

namespace kvdiff::harness {

// One line per step (parameter string, each path's status and largest difference), then the
// first divergence and the first backend error in detail, then a summary line. ANSI colour only
// when color is true (the CLI passes isatty(stdout)).
std::string FormatTerminal(const RunReport& report, bool color);

// Everything in the report, with kvdiff version, model description and tolerances. Non-finite
// numbers are written as null (JSON has no NaN), with the value spelled out beside them.
nlohmann::json ReportToJson(const RunReport& report);

// JUnit XML: one <testsuite> for the scenario, one <testcase> per step; a step fails when any of
// its paths diverges or throws.
std::string ReportToJUnit(const RunReport& report);

// JSON for one comparison, shared with the campaign report.
nlohmann::json ComparisonToJson(const RowComparison& c);
// A double as JSON: null when not finite.
nlohmann::json Number(double value);
// {"rows", "argmax_agree", "top5_overlap_mean", "kl_mean", "kl_max"}
nlohmann::json DistributionToJson(const DistributionStats& stats);
// One "distribution PATH: ..." line per path, for the terminal.
std::string DistributionLines(const std::map<std::string, DistributionStats>& distributions);
// Escapes text for XML attributes and content; characters XML 1.0 cannot hold become '?'.
std::string XmlEscape(const std::string& text);

// ANSI colours for terminal reports; Paint returns the text unchanged when color is false (stdout
// is not a terminal).
extern const char* const kGreen;
extern const char* const kRed;
extern const char* const kYellow;
extern const char* const kBold;
std::string Paint(const std::string& text, const char* colour, bool color);
// "1.8e-04 at impl~ref, conversation c0, position 511, within its gate 6.1e-04 (tolerance 1.0e-04
// + rope-f32 allowance 1.0e-06 x 511)", "... within the tolerance 1.0e-04" ("beyond" when it
// failed); "0 (no row compared)".
std::string WorstRowText(const WorstRow& worst);
// {"diff", "gate", "gate_basis", "path", "step", "conversation", "position", "within"}; null when
// no row was compared. `kvdiff merge` reads it back, every field checked
// (harness/campaign/shard_report.cc).
nlohmann::json WorstRowToJson(const WorstRow& worst);

// Writes text to a file, creating its folder; InputError naming the path when it cannot.
void WriteTextFile(const std::filesystem::path& path, const std::string& text);

}  // namespace kvdiff::harness
