// Whether a text starts or ends with another: tensor names, file suffixes, Jinja's
// startswith/endswith. One definition, because four files had written their own.
#ifndef KVDIFF_FORMAT_AFFIXES_H_
#define KVDIFF_FORMAT_AFFIXES_H_

#include <string_view>

namespace kvdiff::format {

inline bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

inline bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace kvdiff::format

#endif  // KVDIFF_FORMAT_AFFIXES_H_
