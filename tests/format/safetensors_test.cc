// safetensors: every malformed-file case, written byte by byte, must give a clear error; the 16-bit
// conversions are checked exhaustively against values computed independently in the test.
#include "format/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "format/error.h"
#include "tests/test_support.h"

namespace kvdiff::format {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string LittleEndian64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

void WriteBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file from a header text and a data section, the header length taken from the text.
std::string FileBytes(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

std::string OpenError(const std::filesystem::path& path) {
  try {
    SafetensorsFile::Open(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

class Malformed : public ::testing::Test {
 protected:
  std::string ErrorFor(const std::string& bytes) {
    WriteBytes(path_, bytes);
    return OpenError(path_);
  }
  std::string ErrorFor(const std::string& header, size_t data_bytes) {
    return ErrorFor(FileBytes(header, std::string(data_bytes, '\0')));
  }
  testing::TempDir dir_;
  std::filesystem::path path_ = dir_ / "bad.safetensors";
};

TEST_F(Malformed, ShorterThanHeaderLength) {
  EXPECT_THAT(ErrorFor(std::string("\x05\x00\x00", 3)),
              AllOf(HasSubstr(path_.string()), HasSubstr("file is 3 bytes"),
                    HasSubstr("shorter than the 8-byte header length")));
  EXPECT_THAT(ErrorFor(""), HasSubstr("file is 0 bytes"));
}

TEST_F(Malformed, HeaderLengthBeyondFile) {
  EXPECT_THAT(ErrorFor(LittleEndian64(1000) + "{}"),
              AllOf(HasSubstr("header length 1000 goes beyond the end of the file"),
                    HasSubstr("10 bytes"), HasSubstr("at most 2 header bytes")));
  EXPECT_THAT(ErrorFor(LittleEndian64(~uint64_t{0}) + "{}"), HasSubstr("goes beyond the end"));
}

TEST_F(Malformed, BadJson) {
  EXPECT_THAT(ErrorFor("{\"w\": {\"dtype\": \"F32\",", 0),
              AllOf(HasSubstr(path_.string()), HasSubstr("the 22-byte header: invalid JSON")));
  EXPECT_THAT(ErrorFor("[1, 2, 3]", 0), HasSubstr("header must be a JSON object, found array"));
  EXPECT_THAT(ErrorFor("", 0), HasSubstr("the 0-byte header: invalid JSON"));
}

TEST_F(Malformed, UnknownDtype) {
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("unsupported dtype \"Q4\""),
                    HasSubstr("expected one of F32, F16, BF16, F64")));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("\"dtype\" must be a string")));
}

TEST_F(Malformed, MissingKeys) {
  EXPECT_THAT(ErrorFor(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("missing \"dtype\"")));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
              HasSubstr("missing \"shape\""));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
              HasSubstr("missing \"data_offsets\""));
  EXPECT_THAT(ErrorFor(R"({"w":[1,2]})", 0),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("expected an object")));
}

TEST_F(Malformed, BadShape) {
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":"2x3","data_offsets":[0,24]}})", 24),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("\"shape\" must be a list")));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", 24),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("non-negative integer, found -3")));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
              HasSubstr("non-negative integer, found 2.5"));
  // Absurd shapes are refused before their product can overflow.
  EXPECT_THAT(
      ErrorFor(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
               8),
      HasSubstr("more elements than the file has bytes"));
}

TEST_F(Malformed, BadDataOffsets) {
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("must be [begin, end], found [0]")));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
              HasSubstr("data_offsets [8, 0] end before they begin"));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
              HasSubstr("non-negative integer, found -8"));
}

TEST_F(Malformed, OffsetsOutOfRange) {
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 16),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("data_offsets [0, 64] out of range"),
                    HasSubstr("the data section has 16 bytes")));
}

TEST_F(Malformed, ByteLengthNotMatchingShape) {
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("hold 20 bytes"),
                    HasSubstr("shape [2, 3] of F32 needs 24 bytes")));
  EXPECT_THAT(ErrorFor(R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", 16),
              HasSubstr("shape [4] of BF16 needs 8 bytes"));
}

TEST_F(Malformed, OverlappingOffsets) {
  EXPECT_THAT(ErrorFor(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                       24),
              AllOf(HasSubstr("tensors \"a\" and \"b\" overlap"), HasSubstr("starts at byte 8"),
                    HasSubstr("ends at byte 16")));
}

TEST_F(Malformed, GapAndTrailingBytes) {
  EXPECT_THAT(ErrorFor(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[20,36]}})",
                       36),
              AllOf(HasSubstr("gap of 4 bytes"), HasSubstr("before tensor \"b\"")));
  EXPECT_THAT(ErrorFor(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 20),
              AllOf(HasSubstr("4 trailing bytes after the last tensor")));
}

TEST_F(Malformed, BadMetadata) {
  EXPECT_THAT(ErrorFor(R"({"__metadata__":{"format":1}})", 0),
              AllOf(HasSubstr("\"__metadata__\" entry \"format\" must be a string")));
  EXPECT_THAT(ErrorFor(R"({"__metadata__":[]})", 0), HasSubstr("must be an object of strings"));
}

TEST_F(Malformed, NotAFile) {
  EXPECT_THAT(OpenError(dir_ / "absent.safetensors"),
              AllOf(HasSubstr("cannot open"), HasSubstr("absent.safetensors")));
  EXPECT_THAT(OpenError(dir_.path()), HasSubstr("not a regular file"));
}

TEST(Safetensors, ReadsUnalignedHandWrittenFile) {
  testing::TempDir dir;
  // Header of odd length, so the data section is not aligned; F32 [1.5, -2], F16 [1, -0.5].
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},)"
      R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}} )";
  std::string data;
  const float w[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(w), 8);
  data += std::string("\x00\x3C\x00\xB8", 4);  // 0x3C00 = 1.0, 0xB800 = -0.5
  WriteBytes(dir / "f.safetensors", FileBytes(header, data));
  const SafetensorsFile f = SafetensorsFile::Open(dir / "f.safetensors");
  EXPECT_EQ(f.ReadFloat("w"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.ReadFloat("h"), (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_EQ(f.Get("h").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(f.Get("h").nbytes, 4u);
  try {
    f.Get("missing");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("no tensor named \"missing\""), HasSubstr("h, w")));
  }
}

TEST(Safetensors, EmptyAndScalarTensors) {
  testing::TempDir dir;
  WriteSafetensors(dir / "e.safetensors",
                   {{"empty", DType::kF32, {0, 4}, {}}, {"scalar", DType::kBF16, {}, {3.0f}}});
  const SafetensorsFile f = SafetensorsFile::Open(dir / "e.safetensors");
  EXPECT_TRUE(f.ReadFloat("empty").empty());
  EXPECT_EQ(f.ReadFloat("scalar"), std::vector<float>{3.0f});
}

// Independent decoders: the value of a bit pattern computed with ldexp, not with bit tricks.
double HalfValue(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v;
  if (exponent == 0x1F) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}
double BFloat16Value(uint16_t b) {
  const int sign = b >> 15, exponent = (b >> 7) & 0xFF, mantissa = b & 0x7F;
  double v;
  if (exponent == 0xFF) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -133);
  } else {
    v = std::ldexp(128 + mantissa, exponent - 134);
  }
  return sign ? -v : v;
}

// Every 16-bit pattern as a raw file; read back through the reader and compared with the decoder.
void CheckAllPatterns(DType dtype, double (*decode)(uint16_t)) {
  testing::TempDir dir;
  const std::string name = DTypeName(dtype);
  std::string data(65536 * 2, '\0');
  for (uint32_t i = 0; i < 65536; ++i) {
    data[2 * i] = static_cast<char>(i & 0xFF);
    data[2 * i + 1] = static_cast<char>(i >> 8);
  }
  const std::string header =
      "{\"x\":{\"dtype\":\"" + name + "\",\"shape\":[65536],\"data_offsets\":[0,131072]}}";
  WriteBytes(dir / "all.safetensors", FileBytes(header, data));
  const std::vector<float> values = SafetensorsFile::Open(dir / "all.safetensors").ReadFloat("x");
  ASSERT_EQ(values.size(), 65536u);
  std::vector<float> finite_values;
  for (uint32_t i = 0; i < 65536; ++i) {
    const double expected = decode(static_cast<uint16_t>(i));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(values[i])) << name << " pattern " << i;
      EXPECT_TRUE(std::isnan(RoundToDType(values[i], dtype)));
      continue;
    }
    ASSERT_EQ(static_cast<double>(values[i]), expected) << name << " pattern " << i;
    EXPECT_EQ(std::signbit(values[i]), (i >> 15) != 0) << name << " pattern " << i;
    finite_values.push_back(values[i]);
  }
  // Writing the decoded values back gives the same bytes (nan payloads aside: none written).
  std::vector<float> no_nan;
  std::vector<uint16_t> patterns;
  for (uint32_t i = 0; i < 65536; ++i) {
    if (!std::isnan(values[i])) {
      no_nan.push_back(values[i]);
      patterns.push_back(static_cast<uint16_t>(i));
    }
  }
  WriteSafetensors(dir / "back.safetensors",
                   {{"x", dtype, {static_cast<int64_t>(no_nan.size())}, no_nan}});
  const SafetensorsFile back = SafetensorsFile::Open(dir / "back.safetensors");
  const TensorView& view = back.Get("x");
  for (size_t k = 0; k < patterns.size(); ++k) {
    uint16_t got;
    std::memcpy(&got, view.data + 2 * k, 2);
    ASSERT_EQ(got, patterns[k]) << name << " value " << no_nan[k];
  }
}

TEST(Safetensors, EveryHalfPatternDecodesAndRoundTrips) {
  CheckAllPatterns(DType::kF16, HalfValue);
}
TEST(Safetensors, EveryBFloat16PatternDecodesAndRoundTrips) {
  CheckAllPatterns(DType::kBF16, BFloat16Value);
}

// Round to nearest, ties to even, by search over the decoded finite positive values: the
// reference for RoundToDType (and hence the writer) on random floats.
float NearestEven(float x, double (*decode)(uint16_t), double overflow_threshold) {
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= overflow_threshold) return std::copysign(std::numeric_limits<float>::infinity(), x);
  // Finite positive patterns are ordered like their values: binary search on the pattern.
  uint32_t lo = 0, hi = 0x7C00;  // F16 inf; for BF16 the caller's decode still orders below 0x7F80
  if (decode == BFloat16Value) hi = 0x7F80;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (decode(static_cast<uint16_t>(mid)) <= ax)
      lo = mid;
    else
      hi = mid;
  }
  const double below = decode(static_cast<uint16_t>(lo)), above = decode(static_cast<uint16_t>(hi));
  double r;
  if (ax - below < above - ax)
    r = below;
  else if (ax - below > above - ax)
    r = above;
  else
    r = (lo % 2 == 0) ? below : above;
  return static_cast<float>(std::copysign(r, static_cast<double>(x)));
}

TEST(Safetensors, RoundingToNearestEvenOnRandomFloats) {
  std::mt19937_64 rng(12345);  // fixed seed; any seed must pass
  // Overflow thresholds: the midpoint between the largest finite value and the next power of two.
  const double half_overflow = 65520.0;
  const double bf16_overflow = std::ldexp(256.0 - 0.5, 120);  // (2^8 - 0.5) * 2^120
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float x;
    std::memcpy(&x, &bits, 4);
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(RoundToDType(x, DType::kBF16), NearestEven(x, BFloat16Value, bf16_overflow))
        << "bf16 of " << x << " bits " << bits;
    // Floats in F16's range and just beyond, drawn by exponent so subnormals are well covered.
    const float y = std::ldexp(static_cast<float>(rng() % (1u << 24)) / (1u << 24) + 0.5f,
                               static_cast<int>(rng() % 48) - 30) *
                    ((rng() & 1) ? -1.0f : 1.0f);
    ASSERT_EQ(RoundToDType(y, DType::kF16), NearestEven(y, HalfValue, half_overflow))
        << "f16 of " << y;
  }
}

TEST(Safetensors, NamedRoundingCases) {
  // BF16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6.
  EXPECT_EQ(RoundToDType(1.0f + std::ldexp(1.0f, -8), DType::kBF16), 1.0f);
  EXPECT_EQ(RoundToDType(1.0f + 3 * std::ldexp(1.0f, -8), DType::kBF16),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isinf(RoundToDType(std::numeric_limits<float>::max(), DType::kBF16)));
  EXPECT_TRUE(std::isnan(RoundToDType(std::numeric_limits<float>::quiet_NaN(), DType::kBF16)));
  // F16 ties, overflow and subnormals.
  EXPECT_EQ(RoundToDType(1.0f + std::ldexp(1.0f, -11), DType::kF16), 1.0f);
  EXPECT_EQ(RoundToDType(1.0f + 3 * std::ldexp(1.0f, -11), DType::kF16),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(RoundToDType(65504.0f, DType::kF16), 65504.0f);
  EXPECT_EQ(RoundToDType(65519.0f, DType::kF16), 65504.0f);
  EXPECT_TRUE(std::isinf(RoundToDType(65520.0f, DType::kF16)));
  EXPECT_EQ(RoundToDType(std::ldexp(1.0f, -24), DType::kF16), std::ldexp(1.0f, -24));
  EXPECT_EQ(RoundToDType(std::ldexp(1.0f, -25), DType::kF16), 0.0f);  // tie -> even (0)
  EXPECT_EQ(RoundToDType(3 * std::ldexp(1.0f, -25), DType::kF16), std::ldexp(1.0f, -23));
  EXPECT_TRUE(std::signbit(RoundToDType(-1e-30f, DType::kF16)));
  EXPECT_EQ(RoundToDType(-1e-30f, DType::kF16), 0.0f);
}

TEST(Safetensors, F32AndF64RoundTripExactly) {
  testing::TempDir dir;
  const float denorm = std::numeric_limits<float>::denorm_min();
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.0f,
                                     -3.25f,
                                     1e-40f,
                                     denorm,
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN()};
  const int64_t n = static_cast<int64_t>(values.size());
  WriteSafetensors(dir / "x.safetensors",
                   {{"f32", DType::kF32, {n}, values}, {"f64", DType::kF64, {n}, values}});
  const SafetensorsFile f = SafetensorsFile::Open(dir / "x.safetensors");
  for (const char* name : {"f32", "f64"}) {
    const std::vector<float> back = f.ReadFloat(name);
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::isnan(values[i])) {
        EXPECT_TRUE(std::isnan(back[i]));
      } else {
        EXPECT_EQ(back[i], values[i]) << name << " " << i;
        EXPECT_EQ(std::signbit(back[i]), std::signbit(values[i]));
      }
    }
  }
}

TEST(Safetensors, WriterIsDeterministicSortedAndPadded) {
  testing::TempDir dir;
  const std::vector<TensorToWrite> tensors = {{"zeta", DType::kF32, {2}, {1.0f, 2.0f}},
                                              {"alpha", DType::kBF16, {3}, {1.0f, 2.0f, 3.0f}}};
  WriteSafetensors(dir / "a.safetensors", tensors, {{"format", "pt"}});
  WriteSafetensors(dir / "b.safetensors", tensors, {{"format", "pt"}});
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string a = read(dir / "a.safetensors");
  EXPECT_EQ(a, read(dir / "b.safetensors"));
  uint64_t header_len;
  std::memcpy(&header_len, a.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  const std::string header = a.substr(8, header_len);
  // Sorted keys; offsets follow the order given (zeta first).
  EXPECT_LT(header.find("\"__metadata__\""), header.find("\"alpha\""));
  EXPECT_LT(header.find("\"alpha\""), header.find("\"zeta\""));
  EXPECT_THAT(header, HasSubstr(R"("zeta":{"data_offsets":[0,8],"dtype":"F32","shape":[2]})"));
  EXPECT_THAT(header, HasSubstr(R"("alpha":{"data_offsets":[8,14],"dtype":"BF16","shape":[3]})"));
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  EXPECT_EQ(a.size(), 8 + header_len + 14);
  // No temporary file left beside the output.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 2);
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesNoFile) {
  testing::TempDir dir;
  try {
    WriteSafetensors(dir / "x.safetensors", {{"w", DType::kF32, {2, 3}, {1.0f, 2.0f}}});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor \"w\" has shape [2, 3] (6 elements) but 2 values"));
  }
  EXPECT_THROW(WriteSafetensors(dir / "x.safetensors",
                                {{"w", DType::kF32, {1}, {1.0f}}, {"w", DType::kF32, {1}, {1.0f}}}),
               InputError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_THROW(
      WriteSafetensors(dir / "no" / "such" / "dir.safetensors", {{"w", DType::kF32, {1}, {1.0f}}}),
      InputError);
}

TEST(Safetensors, OverwritesAtomicallyAndReleaseKeepsDataReadable) {
  testing::TempDir dir;
  const auto path = dir / "x.safetensors";
  std::vector<float> values(100000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  WriteSafetensors(path, {{"w", DType::kF32, {100000}, std::vector<float>(100000, 7.0f)}});
  WriteSafetensors(path, {{"w", DType::kF32, {100000}, values}});
  const SafetensorsFile f = SafetensorsFile::Open(path);
  EXPECT_EQ(f.ReadFloat("w"), values);
  f.Release("w");
  EXPECT_EQ(f.ReadFloat("w"), values);  // pages fault back in from the file
}

TEST(Safetensors, DTypeNames) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  try {
    ParseDType("I8");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unsupported dtype \"I8\""));
  }
}

// A write goes through a symlink to the file it names (a dangling one too), and never over what is
// not a regular file: the rename replaced a FIFO, or as root a device node, with a file.
TEST(WriteFileAtomically, WritesThroughASymlinkAndRefusesWhatIsNoRegularFile) {
  testing::TempDir dir;
  std::filesystem::create_symlink("target.st", dir / "link.st");
  WriteFileAtomically(dir / "link.st", "abc");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.st"));
  EXPECT_EQ(testing::ReadFile(dir / "target.st"), "abc");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  try {
    WriteFileAtomically(dir / "fifo", "abc");
    FAIL() << "wrote over a FIFO";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("it exists and is not a regular file"));
  }
  EXPECT_TRUE(std::filesystem::is_fifo(dir / "fifo"));
}

}  // namespace
}  // namespace kvdiff::format
