// The kvdiff engine protocol (docs/protocol.md): how kvdiff talks to an engine in another process.
// One request, one reply, over a byte stream: `kvdiff engine-host` (an isolated plugin) reads it on
// an inherited socket, an `exec:` engine program on its stdin/stdout. Every integer and float is
// little-endian, whatever the host: a program in any language on any machine can speak it.
//
//   request: a 32-byte header (EncodeRequest) and a body whose size the header gives
//            (RequestBodyBytes): tokens (int32), batch items, or the open call's two strings;
//   reply:   a 24-byte header (EncodeReply) and `bytes` of payload: the logits (float32,
//            row-major), the error message, or the info text.
//
// The first request is hello, whose reply names the protocol version the child speaks (the
// version rule: docs/protocol.md, "Versions"); then open, info, and the session calls.
// Neither side trusts the other's numbers: the child refuses a request whose sizes are out of
// bounds (kMaxRequestTokens, kMaxBatchItems, kMaxTextBytes), and the parent refuses a reply larger
// than the call can take, so a corrupted or malicious peer cannot make the other allocate
// without bound.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "plugin_host/plugin_loader.h"

namespace kvdiff::engines::wire {

// The versions of this protocol kvdiff speaks. A version only ever adds ops or fields.
inline constexpr int64_t kProtocolVersion = 1;
inline constexpr int64_t kOldestProtocolVersion = 1;

// The numbers are the protocol: never renumber one.
enum class Op : uint32_t {
  kHello = 0,
  kOpen = 1,
  kInfo = 2,
  kNewSession = 3,
  kFree = 4,
  kAppend = 5,
  kLength = 6,
  kTruncate = 7,
  kFork = 8,
  kReset = 9,
  kAppendBatch = 10,
  kShift = 11,  // only to an engine whose info says it shifts (abi_version 3, shifts 1)
};
inline constexpr uint32_t kLastOp = 11;
// A reply's status; any other value is a peer that does not speak this protocol.
enum class Status : uint32_t { kOk = 0, kInputError = 1, kEngineError = 2 };

struct Request {
  Op op = Op::kHello;
  int64_t session = -1;
  int64_t arg = 0;    // hello: the newest version; open: model_dir bytes; truncate: the length;
                      // append_batch: how many items; shift: keep
  int64_t count = 0;  // hello: the oldest version; open: options bytes; append, append_batch:
                      // how many tokens follow; shift: discard
};

// append_batch's body: `arg` of these (16 bytes each), then every item's tokens in item order
// (`count` in all), then one output flag byte per token (1: its row comes back).
struct BatchItemHeader {
  int64_t session;  // the child's session id
  int64_t n;        // the item's tokens, >= 1
};

struct Reply {
  Status status = Status::kOk;
  int64_t value = 0;  // hello: the version; a session id, a length, the number of rows
  int64_t bytes = 0;  // payload that follows
};

inline constexpr size_t kRequestHeaderBytes = 32;
inline constexpr size_t kReplyHeaderBytes = 24;
inline constexpr size_t kBatchItemHeaderBytes = 16;

// The most tokens and batch items one request may carry: bounds on what the child allocates.
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 30;
inline constexpr int64_t kMaxBatchItems = int64_t{1} << 20;
// The largest text either side reads: an error message, the info, open's model_dir or options
// (a few hundred bytes in practice). A reply of logits may be as large as its rows and the vocab
// make it.
inline constexpr int64_t kMaxTextBytes = int64_t{1} << 20;
// The vocab sizes the parent accepts from the child's info: beyond them a row would not fit the
// arithmetic of the bounds above.
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;

// What a call is, for messages: "append", "truncate".
const char* OpName(Op op);

// The headers as their bytes on the wire, and back. Decoding never fails: what a header means is
// the reader's to check (an unknown op, a status out of range, sizes out of bounds).
std::array<char, kRequestHeaderBytes> EncodeRequest(const Request& request);
Request DecodeRequest(const char* bytes);
std::array<char, kReplyHeaderBytes> EncodeReply(const Reply& reply);
Reply DecodeReply(const char* bytes);
void AppendBatchItemHeader(std::string& out, const BatchItemHeader& item);
BatchItemHeader DecodeBatchItemHeader(const char* bytes);

// Arrays of int32 tokens and float32 logits, little-endian on the wire.
void AppendTokens(std::string& out, const Token* tokens, size_t n);
void ReadTokens(const char* bytes, size_t n, Token* tokens);
void AppendFloats(std::string& out, const float* values, size_t n);
void ReadFloats(const char* bytes, size_t n, float* values);

// "00 01 ff ..." of at most `max` bytes, for messages that say what a peer sent.
std::string Hex(const char* bytes, size_t n, size_t max = 32);

// The size of the body that follows `request`'s header; -1 when its op is unknown or its sizes are
// out of bounds (the request is then refused: the peer is not speaking this protocol).
int64_t RequestBodyBytes(const Request& request);

// Whole writes; false when the other side is gone. MSG_NOSIGNAL: a dead peer is an error to
// report, not a SIGPIPE that kills the process. With a deadline, also false when it passes before
// the peer has taken everything (a peer that stops reading): `timed_out` says which. With `peer`
// (the child process at the other end), also false as soon as that process has exited: a helper
// it started may hold the socket open, and then no end of stream would come before the deadline.
bool SendAll(int fd, const void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
             bool* timed_out = nullptr, pid_t peer = -1);

// Whole reads; false at end of file or an error. With a deadline, also false when it passes
// (`timed_out` says which); with `peer`, when that process has exited (as SendAll). `got`, when
// given, receives how many bytes did arrive.
bool ReadAll(int fd, void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
             bool* timed_out = nullptr, size_t* got = nullptr, pid_t peer = -1);

// The info as a small text: name, version, abi_version and the numbers one a line (abi_version 3
// adds whether the engine shifts), then one "name value" line per interesting size; and back.
std::string EncodeInfo(const EngineInfo& info);
EngineInfo DecodeInfo(const std::string& text);  // EngineError when malformed

}  // namespace kvdiff::engines::wire
