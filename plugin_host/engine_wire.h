// The wire between kvdiff and an isolated engine's child process (plugin_host/isolated_engine.h):
// one request, one reply, in this machine's byte order (parent and child are the same binary on
// the same machine). A request is a header and a body whose size the header gives
// (RequestBodyBytes); a reply is a header and `bytes` of payload: the logits (float32, row-major),
// the error message, or the info.
//
// Neither side trusts the other's numbers: the child refuses a request whose sizes are out of
// bounds (kMaxRequestTokens, kMaxBatchItems) by exiting, and the parent refuses a reply larger
// than the call can take, so a corrupted or malicious peer cannot make the other allocate
// without bound.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "plugin_host/plugin_loader.h"

namespace kvdiff::engines::wire {

enum class Op : uint32_t {
  kInfo,
  kNewSession,
  kFree,
  kAppend,
  kLength,
  kTruncate,
  kFork,
  kReset,
  kAppendBatch,
};
enum class Status : uint32_t { kOk, kInputError, kEngineError };

struct Request {
  Op op;
  uint32_t unused = 0;
  int64_t session = -1;
  int64_t arg = 0;    // truncate: the length; append_batch: how many items
  int64_t count = 0;  // append, append_batch: how many tokens follow
};

// append_batch's body: `arg` of these, then every item's tokens in item order (`count` in all),
// then one output flag byte per token (1: its row comes back).
struct BatchItemHeader {
  int64_t session;  // the child's session id
  int64_t n;        // the item's tokens, >= 1
};

struct Reply {
  Status status;
  uint32_t unused = 0;
  int64_t value = 0;  // a session id, a length, the number of rows
  int64_t bytes = 0;  // payload that follows
};

// The most tokens and batch items one request may carry: bounds on what the child allocates.
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 30;
inline constexpr int64_t kMaxBatchItems = int64_t{1} << 20;
// The largest reply of text (an error message, the info) the parent reads: a few hundred bytes
// in practice. A reply of logits may be as large as its rows and the vocab make it.
inline constexpr int64_t kMaxTextReplyBytes = int64_t{1} << 20;
// The vocab sizes the parent accepts from the child's info: beyond them a row would not fit the
// arithmetic of the bounds above.
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;

// What a call is, for messages: "append", "truncate".
const char* OpName(Op op);

// The size of the body that follows `request`'s header; -1 when its sizes are out of bounds
// (the request is then refused: the peer is not speaking this protocol).
int64_t RequestBodyBytes(const Request& request);

// Whole writes; false when the other side is gone. MSG_NOSIGNAL: a dead peer is an error to
// report, not a SIGPIPE that kills the process.
bool SendAll(int fd, const void* data, size_t size);

// Whole reads; false at end of file or an error. With a deadline, also false when it passes
// (`timed_out` says which).
bool ReadAll(int fd, void* data, size_t size,
             std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
             bool* timed_out = nullptr);

// The info as a small text: name, version, then one "key value" per line; and back.
std::string EncodeInfo(const EngineInfo& info);
EngineInfo DecodeInfo(const std::string& text);  // EngineError when malformed

}  // namespace kvdiff::engines::wire
