// Reading `kvdiff conform`'s table (ConformReport::Table(), the command's standard output): the
// row of one check. Shared by conform_cli_test.cc and conform_library_test.cc.
#pragma once

#include <cstddef>
#include <string>

namespace kvdiff::testing {

// The row of the table for one check: "  name   RESULT  detail".
inline std::string RowOf(const std::string& table, const std::string& check) {
  const size_t at = table.find("\n  " + check + " ");
  if (at == std::string::npos) return "";
  const size_t end = table.find('\n', at + 1);
  return table.substr(at + 1, end - at - 1);
}

}  // namespace kvdiff::testing
