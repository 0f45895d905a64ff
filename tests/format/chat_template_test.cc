// Chat templates: hand-checked renders of the three families' templates and the refusals. The
// byte-for-byte comparison with transformers.js' Jinja is in tokenizer_oracle_test.cc.
#include "format/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "format/error.h"

namespace kvdiff::format {
namespace {

using ::testing::HasSubstr;

const char* kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";

TEST(ChatTemplate, ChatMlWithGenerationPrompt) {
  const ChatTemplate t(kChatMl);
  const std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(t.Render(m, true, "", ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.Render(m, false, "", ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, LoopVariablesSlicesFiltersAndScoping) {
  const ChatTemplate t(
      "{% set x = 'outer' %}{% for m in messages[1:] %}{% set x = 'inner' %}"
      "{{ loop.index0 }}{{ '<' if loop.first }}{{ m.content | trim }}{% if not loop.last %},"
      "{% endif %}{% endfor %}|{{ x }}|{{ messages | length }}|{{ messages[-1]['role'] }}");
  const std::vector<ChatMessage> m = {{"a", "zero"}, {"b", "  one "}, {"c", "two\n"}};
  // Jinja scoping: the loop's set does not leak out.
  EXPECT_EQ(t.Render(m, false, "", ""), "0<one,1two|outer|3|c");
}

TEST(ChatTemplate, WhitespaceControlAndBlockTrimming) {
  const ChatTemplate t("{%- for m in messages %}\n  {{- m.content }}\n{% endfor -%}\n  end\n");
  EXPECT_EQ(t.Render({{"u", "a"}, {"u", "b"}}, false, "", ""), "a\nb\nend");
}

TEST(ChatTemplate, RaiseExceptionIsAnInputError) {
  const ChatTemplate t(
      "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}"
      "{% endif %}ok");
  EXPECT_EQ(t.Render({{"user", "x"}}, false, "", ""), "ok");
  try {
    t.Render({{"assistant", "x"}}, false, "", "");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("chat template raised an exception: roles must alternate"));
  }
}

void ExpectRefused(const std::string& source, const std::string& message) {
  try {
    ChatTemplate(source).Render({{"user", "hi"}}, true, "<s>", "</s>");
    FAIL() << "expected InputError containing: " << message;
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(message));
  }
}

TEST(ChatTemplate, RefusesWhatItDoesNotImplementByName) {
  ExpectRefused("{% macro f() %}{% endmacro %}", "line 1: {% macro %} is not implemented");
  ExpectRefused("{{ messages | tojson }}", "the filter tojson is not implemented");
  ExpectRefused("{{ range(3) }}", "the function range() is not implemented");
  ExpectRefused("{{ add_generation_prompt }}", "printing a boolean is not implemented");
  ExpectRefused("{{ 1.5 }}", "floating-point numbers are not implemented");
  ExpectRefused("{{ 4 / 2 }}", "the operator / is not implemented");
  ExpectRefused("{% for k, v in x %}{% endfor %}", "several loop variables");
  ExpectRefused("{% set ns.x = 1 %}", "only \"{% set name = value %}\" is implemented");
  ExpectRefused("a\n{% if true %}x", "line 2: {% if %} is not closed by {% endif %}");
  ExpectRefused("{{ 'abc' }", "line 1");
  ExpectRefused("{{ x.y }}", "cannot index a undefined");
  ExpectRefused("{{ 'a\\q' }}", "the escape \\q is not implemented");
  ExpectRefused("{{ messages[0].content.upper() ~ ('é' | upper) }}", "non-ASCII");
}

std::string Times(size_t n, const std::string& text) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += text;
  return out;
}

// Templates come from model files: nothing in one may overflow the stack (the parser and the
// renderer recurse on nesting; fuzzing found "- - - ... 1" crashing), run without end or fill the
// memory. Each limit is refused by name, and what real templates do stays well inside them.
TEST(ChatTemplate, RefusesWhatWouldOverflowTheStackOrRunAway) {
  const std::string deep = "nesting deeper than 100 levels";
  ExpectRefused("{{ " + Times(100000, "-") + "1 }}", deep);
  ExpectRefused("{{ " + Times(100000, "not ") + "true }}", deep);
  ExpectRefused("{{ " + Times(100000, "(") + "1" + Times(100000, ")") + " }}", deep);
  ExpectRefused("{{ " + Times(100000, "[") + Times(100000, "]") + " }}", deep);
  ExpectRefused("{{ 1" + Times(100000, " + 1") + " }}", deep);  // a loop builds it: the tree
  ExpectRefused("{{ x" + Times(100000, ".y") + " }}", deep);
  ExpectRefused("{{ 'a'" + Times(100000, " | trim") + " }}", deep);
  ExpectRefused(Times(100000, "{% if true %}"), deep);
  ExpectRefused("{% if false %}" + Times(100000, "{% elif false %}") + "{% endif %}", deep);
  ExpectRefused("{% set x = 1 %}" + Times(1000, "{% set x = [x] %}") + "{{ x | length }}",
                "line 1: nesting deeper than 100 levels (a list in a list ...)");
  ExpectRefused("{% set x = 'ab' %}" + Times(40, "{% set x = x ~ x %}"),
                "a text of 8388608 bytes is larger than the limit of 4 MiB");
  ExpectRefused("{% set x = 'ab' %}" + Times(40, "{% set x = x + x %}"),
                "a text of 8388608 bytes is larger than the limit of 4 MiB");
  // Each read of a 2 MiB text is a copy: 65 of them are more than 128 MiB.
  ExpectRefused(
      "{% set x = 'ab' %}" + Times(20, "{% set x = x ~ x %}") + Times(65, "{% set y = x[0] %}"),
      "rendering handled more than 128 MiB of text");
  ExpectRefused("{% set x = [1] %}" + Times(40, "{% set x = x + x %}"),
                "longer than the limit of 1048576");
  // Work one step hides: a 2^20-item list searched in a loop ran on without end, and copies of it
  // piled up hundreds of MB.
  const std::string big = "{% set l = [1] %}" + Times(20, "{% set l = l + l %}");
  ExpectRefused(big + "{% for i in l %}{% if 2 in l %}x{% endif %}{% endfor %}",
                "rendering looked through more than 67108864 list items, keys and bytes");
  ExpectRefused(big + "{% set a = [l + l[1:], l[1:] + l] %}{{ a | length }}",
                "rendering created more than 2097152 list items in all");
  ExpectRefused("{{ 999999999999999999 * 999999999999999999 }}", "integer overflow");
  ExpectRefused("{{ -999999999999999999 - 999999999999999999 * 9 }}", "integer overflow");
  const std::vector<ChatMessage> ten(10, {"user", "hi"});
  try {
    ChatTemplate(Times(8, "{% for m in messages %}") + "x" + Times(8, "{% endfor %}"))
        .Render(ten, true, "", "");
    FAIL() << "10^8 iterations rendered";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rendering took more than 1000000 steps"));
  }

  const int inside = 99;  // just inside every limit
  EXPECT_EQ(ChatTemplate("{{ " + Times(inside, "(") + "7" + Times(inside, ")") + " }}")
                .Render({}, false, "", ""),
            "7");
  EXPECT_EQ(ChatTemplate("{{ " + Times(inside, "-") + "7 }}").Render({}, false, "", ""), "-7");
  EXPECT_EQ(ChatTemplate(Times(inside, "{% if true %}") + "y" + Times(inside, "{% endif %}"))
                .Render({}, false, "", ""),
            "y");
}

TEST(ChatMessages, JsonOrRoleLines) {
  std::vector<ChatMessage> m = ParseChatMessages(
      R"([{"role": "system", "content": "S"}, {"role": "user", "content": "two\nlines"}])");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[1].role, "user");
  EXPECT_EQ(m[1].content, "two\nlines");
  m = ParseChatMessages("system: Be brief.\nuser: Hello\nsecond line\n");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].content, "Be brief.");
  EXPECT_EQ(m[1].role, "user");
  EXPECT_EQ(m[1].content, "Hello\nsecond line");
  EXPECT_THROW(ParseChatMessages("no role here"), InputError);
  EXPECT_THROW(ParseChatMessages("[{\"role\": \"user\"}]"), InputError);
  EXPECT_THROW(ParseChatMessages(""), InputError);
}

}  // namespace
}  // namespace kvdiff::format
