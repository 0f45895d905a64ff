// `kvdiff check --html`: the campaign's report as one self-contained page, made from the same
// CampaignReport as --json: the verdict, the failing cases (failure, shrunk failure, the files
// that replay them), the worst difference and the coverage histograms as bar charts.
#pragma once

#include <string>

#include "harness/campaign/campaign.h"

namespace kvdiff::harness {

std::string CampaignReportToHtml(const CampaignReport& report);

}  // namespace kvdiff::harness
