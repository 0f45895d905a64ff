// A stand-in for `kvdiff engine-host` that lies, for batch_test: kvdiff's own engine host
// (engines::ServeIsolatedEngine, on a thread) behind a proxy that passes every request through and
// rewrites the reply to append_batch as the engine option host_lie=WHAT says (taken out of the
// open call's options; the others go to the engine):
//
//   host_lie=rows   claims one row more than it sends (the payload is the real one)
//   host_lie=short  drops the last row: a consistent reply of one row too few
//   host_lie=huge   announces a reply of 2^50 bytes and sends nothing more
//   host_lie=negative_ids  tells kvdiff every session id as -id - 100 (the protocol lets an engine
//                   choose any i64) and maps them back on the way in: no lie, a correct engine
//                   that holds at most 8 sessions at once (so a parent that never frees one runs
//                   out)
//
// The parent must refuse each with an EngineError and never allocate what `huge` announces. The
// child's code is kvdiff's, but it shares its process with the plugin under test: a wild write
// there could do any of these.
//
// Usage, as IsolatedEngine::Start spawns a host: HOST engine-host --fd=3 PLUGIN
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "plugin_host/engine_wire.h"
#include "plugin_host/isolated_engine.h"

namespace {

using kvdiff::engines::wire::Op;
using kvdiff::engines::wire::Reply;
using kvdiff::engines::wire::Request;
using kvdiff::engines::wire::Status;
namespace wire = kvdiff::engines::wire;

constexpr int kParentFd = 3;

// Splits host_lie=WHAT out of `options`; the rest, in order, is the engine's.
std::string TakeLie(std::string& options) {
  std::string lie, rest;
  size_t begin = 0;
  while (begin <= options.size()) {
    size_t end = options.find(',', begin);
    if (end == std::string::npos) end = options.size();
    const std::string item = options.substr(begin, end - begin);
    if (item.rfind("host_lie=", 0) == 0) {
      lie = item.substr(9);
    } else if (!item.empty()) {
      rest += (rest.empty() ? "" : ",") + item;
    }
    begin = end + 1;
  }
  options = rest;
  return lie;
}

// Rewrites a successful append_batch reply; false when the lie ends the conversation.
bool Lie(const std::string& lie, Reply& reply, std::string& payload) {
  if (lie == "rows") {
    reply.value += 1;
  } else if (lie == "short" && reply.value > 0) {
    payload.resize(payload.size() - payload.size() / static_cast<size_t>(reply.value));
    reply.value -= 1;
    reply.bytes = static_cast<int64_t>(payload.size());
  } else if (lie == "huge") {
    reply.bytes = int64_t{1} << 50;
    const auto header = wire::EncodeReply(reply);
    wire::SendAll(kParentFd, header.data(), header.size());
    return false;
  }
  return true;
}

// host_lie=negative_ids: the engine's id as the parent sees it, and back (an involution).
int64_t FlipId(int64_t id) { return -id - 100; }

// The request's session ids (its own, and each batch item's) back to the engine's.
void FlipRequestIds(Request& request, std::string& body) {
  if (request.session != -1) request.session = FlipId(request.session);
  if (request.op != Op::kAppendBatch) return;
  for (int64_t i = 0; i < request.arg; ++i) {
    int64_t id = 0;
    char* at = body.data() + i * static_cast<int64_t>(sizeof(wire::BatchItemHeader));
    std::memcpy(&id, at, sizeof id);
    id = FlipId(id);
    std::memcpy(at, &id, sizeof id);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || std::string(argv[1]) != "engine-host") {
    std::fprintf(stderr, "usage: %s engine-host --fd=3 PLUGIN\n", argv[0]);
    return 2;
  }
  const std::string plugin = argv[3];

  int inner[2];  // the proxy's end, the real host's end
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, inner) != 0) return 2;
  std::thread host([&] {
    kvdiff::engines::ServeIsolatedEngine(inner[1], plugin);
    close(inner[1]);
  });

  std::string lie;
  constexpr int kMaxLive = 8;
  int live = 0;  // sessions alive (host_lie=negative_ids)
  char head[wire::kRequestHeaderBytes];
  while (wire::ReadAll(kParentFd, head, sizeof head)) {
    Request request = wire::DecodeRequest(head);
    const int64_t body_bytes = wire::RequestBodyBytes(request);
    if (body_bytes < 0) break;
    std::string body(static_cast<size_t>(body_bytes), '\0');
    if (!wire::ReadAll(kParentFd, body.data(), body.size())) break;
    if (request.op == Op::kOpen) {
      // The body is the model directory (arg bytes), then the options.
      std::string options = body.substr(static_cast<size_t>(request.arg));
      lie = TakeLie(options);
      body = body.substr(0, static_cast<size_t>(request.arg)) + options;
      request.count = static_cast<int64_t>(options.size());
    }
    if (lie == "negative_ids") FlipRequestIds(request, body);
    const bool new_id = request.op == Op::kNewSession || request.op == Op::kFork;
    if (lie == "negative_ids" && new_id && live >= kMaxLive) {
      const std::string message = "lying host: 8 sessions alive at once, the most it holds";
      const auto refusal =
          wire::EncodeReply(Reply{Status::kEngineError, 0, static_cast<int64_t>(message.size())});
      if (!wire::SendAll(kParentFd, refusal.data(), refusal.size()) ||
          !wire::SendAll(kParentFd, message.data(), message.size())) {
        break;
      }
      continue;
    }
    const auto out = wire::EncodeRequest(request);
    char reply_head[wire::kReplyHeaderBytes];
    if (!wire::SendAll(inner[0], out.data(), out.size()) ||
        !wire::SendAll(inner[0], body.data(), body.size()) ||
        !wire::ReadAll(inner[0], reply_head, sizeof reply_head)) {
      break;
    }
    Reply reply = wire::DecodeReply(reply_head);
    std::string payload(static_cast<size_t>(reply.bytes), '\0');
    if (!wire::ReadAll(inner[0], payload.data(), payload.size())) break;
    if (lie == "negative_ids" && new_id && reply.status == Status::kOk) {
      reply.value = FlipId(reply.value);
      ++live;
    }
    if (request.op == Op::kFree && reply.status == Status::kOk) --live;
    if (request.op == Op::kAppendBatch && reply.status == Status::kOk &&
        !Lie(lie, reply, payload)) {
      break;
    }
    const auto reply_out = wire::EncodeReply(reply);
    if (!wire::SendAll(kParentFd, reply_out.data(), reply_out.size()) ||
        !wire::SendAll(kParentFd, payload.data(), payload.size())) {
      break;
    }
  }
  close(inner[0]);  // the real host closes its engine and returns
  host.join();
  return 0;
}
