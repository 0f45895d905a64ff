// The engine protocol's bytes are the ones docs/protocol.md lists: little-endian headers at the
// documented offsets, little-endian int32 tokens and float32 logits, and the bounds that make a
// request "not this protocol". A program in another language is written against that page, so
// these pin the page to the code.
#include "plugin_host/engine_wire.h"

#include <gtest/gtest.h>

#include <string>

namespace kvdiff::engines::wire {
namespace {

std::string Bytes(const char* data, size_t n) { return Hex(data, n, 64); }

TEST(EngineWire, ARequestHeaderIsTheDocumentedThirtyTwoLittleEndianBytes) {
  const auto b = EncodeRequest({Op::kTruncate, 0x0102030405060708, 6, -1});
  EXPECT_EQ(Bytes(b.data(), b.size()),
            "07 00 00 00 00 00 00 00 08 07 06 05 04 03 02 01 "
            "06 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff");
  const Request r = DecodeRequest(b.data());
  EXPECT_EQ(r.op, Op::kTruncate);
  EXPECT_EQ(r.session, 0x0102030405060708);
  EXPECT_EQ(r.arg, 6);
  EXPECT_EQ(r.count, -1);
}

TEST(EngineWire, AReplyHeaderIsTheDocumentedTwentyFourLittleEndianBytes) {
  const auto b = EncodeReply({Status::kEngineError, 3, 17});
  EXPECT_EQ(Bytes(b.data(), b.size()),
            "02 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 11 00 00 00 00 00 00 00");
  const Reply r = DecodeReply(b.data());
  EXPECT_EQ(r.status, Status::kEngineError);
  EXPECT_EQ(r.value, 3);
  EXPECT_EQ(r.bytes, 17);
}

TEST(EngineWire, TokensAndLogitsAreLittleEndianArrays) {
  std::string out;
  const Token tokens[] = {1, 256, -1};
  AppendTokens(out, tokens, 3);
  EXPECT_EQ(Bytes(out.data(), out.size()), "01 00 00 00 00 01 00 00 ff ff ff ff");
  out.clear();
  const float logits[] = {1.0f, -2.5f};
  AppendFloats(out, logits, 2);
  EXPECT_EQ(Bytes(out.data(), out.size()), "00 00 80 3f 00 00 20 c0");
  float back[2];
  ReadFloats(out.data(), 2, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
}

TEST(EngineWire, BodySizesFollowTheOpAndRefuseWhatIsOutOfBounds) {
  EXPECT_EQ(RequestBodyBytes({Op::kHello, -1, 1, 1}), 0);
  EXPECT_EQ(RequestBodyBytes({Op::kOpen, -1, 10, 3}), 13);
  EXPECT_EQ(RequestBodyBytes({Op::kAppend, 0, 0, 5}), 20);
  // 2 items of 16 bytes, 5 tokens of 4 bytes and 5 flags of 1.
  EXPECT_EQ(RequestBodyBytes({Op::kAppendBatch, -1, 2, 5}), 2 * 16 + 5 * 5);
  EXPECT_EQ(RequestBodyBytes({Op::kAppend, 0, 0, 0}), -1);
  EXPECT_EQ(RequestBodyBytes({Op::kAppendBatch, -1, 3, 2}), -1);  // more items than tokens
  EXPECT_EQ(RequestBodyBytes({Op::kOpen, -1, kMaxTextBytes + 1, 0}), -1);
  EXPECT_EQ(RequestBodyBytes({static_cast<Op>(kLastOp + 1), -1, 0, 0}), -1);
}

TEST(EngineWire, AMalformedInfoIsAnEngineErrorNamingTheLine) {
  EXPECT_THROW(DecodeInfo("name\n1\n"), EngineError);
  try {
    DecodeInfo("n\nv\n1\nx\n64\nf32\n0\n0\n");
    FAIL() << "no throw";
  } catch (const EngineError& e) {
    EXPECT_STREQ(e.what(),
                 "engine process: an info reply whose vocab_size (line 4) line is 'x' (expected a "
                 "decimal integer)");
  }
  const EngineInfo info = DecodeInfo("n\nv\n2\n256\n64\nf32\n0\n0\nn_ubatch 7\n");
  EXPECT_EQ(info.vocab_size, 256);
  EXPECT_EQ(info.abi_version, 2u);
  ASSERT_EQ(info.sizes.size(), 1u);
  EXPECT_EQ(info.sizes[0].second, 7);
  EXPECT_FALSE(info.shifts);
}

// abi_version 3: line 9 says whether the engine answers shift (0 or 1), the sizes follow it; a
// version-3 info without it, or with another value, is a breach. Encoding round-trips.
TEST(EngineWire, AVersion3InfoSaysWhetherTheEngineShifts) {
  const EngineInfo info = DecodeInfo("n\nv\n3\n256\n64\nf32\n0\n0\n1\nn_ubatch 7\n");
  EXPECT_EQ(info.abi_version, 3u);
  EXPECT_TRUE(info.shifts);
  ASSERT_EQ(info.sizes.size(), 1u);
  EXPECT_EQ(info.sizes[0].first, "n_ubatch");
  EXPECT_FALSE(DecodeInfo("n\nv\n3\n256\n64\nf32\n0\n0\n0\n").shifts);
  EXPECT_EQ(DecodeInfo(EncodeInfo(info)).shifts, true);
  EXPECT_EQ(DecodeInfo(EncodeInfo(info)).sizes, info.sizes);
  try {
    DecodeInfo("n\nv\n3\n256\n64\nf32\n0\n0\n");
    FAIL() << "no throw";
  } catch (const EngineError& e) {
    EXPECT_STREQ(e.what(),
                 "engine process: an info reply with abi_version 3 and no line 9 (expected line 9, "
                 "shifts: 0 or 1)");
  }
  EXPECT_THROW(DecodeInfo("n\nv\n3\n256\n64\nf32\n0\n0\n2\n"), EngineError);
  EXPECT_THROW(DecodeInfo("n\nv\n4\n256\n64\nf32\n0\n0\n0\n"), EngineError);
  EXPECT_EQ(RequestBodyBytes({Op::kShift, 0, 1, 2}), 0);
  EXPECT_STREQ(OpName(Op::kShift), "shift");
}

}  // namespace
}  // namespace kvdiff::engines::wire
