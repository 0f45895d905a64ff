// The shell every HTML report shares: one self-contained page (inline CSS, inline SVG, no script,
// nothing fetched), so it opens from a CI artifact or an e-mail attachment as it is.
#pragma once

#include <string>
#include <vector>

namespace kvdiff::harness {

// <!DOCTYPE html> ... </html> around body (already HTML); title is escaped.
std::string HtmlPage(const std::string& title, const std::string& body);

// A definition list of (term, HTML value) pairs: the summary at the top of a report.
struct SummaryItem {
  std::string term;
  std::string value_html;
};
std::string HtmlSummary(const std::vector<SummaryItem>& items);

// <span id=ID class=figure data-value=EXACT>SHOWN</span>: a figure shown rounded, with the value
// it came from in full, so a reader (or a test) can hold it to the JSON report's.
std::string HtmlFigure(const std::string& id, double value, const std::string& shown);
std::string HtmlFigure(const std::string& id, int64_t value);

// PASS or FAIL, coloured.
std::string HtmlVerdict(bool passed);

}  // namespace kvdiff::harness
