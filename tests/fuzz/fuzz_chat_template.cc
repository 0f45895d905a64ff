// A chat template (format::ChatTemplate): the bytes up to the first NUL are the template, the
// rest the messages (format::ParseChatMessages); the template is rendered for them.
#include <algorithm>

#include "format/chat_template.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = kvdiff::fuzz::Text(data, size);
  const size_t nul = std::min(text.find('\0'), text.size());
  kvdiff::fuzz::Refusable([&] {
    const kvdiff::format::ChatTemplate tmpl(text.substr(0, nul));
    std::vector<kvdiff::format::ChatMessage> messages = {{"user", "hi"}};
    if (nul < text.size()) messages = kvdiff::format::ParseChatMessages(text.substr(nul + 1));
    (void)tmpl.Render(messages, true, "<s>", "</s>");
  });
  return 0;
}
