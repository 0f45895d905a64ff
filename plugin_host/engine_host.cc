// The child's side of an isolated engine (`kvdiff engine-host`): answers hello, loads the plugin
// and opens the engine on open, and answers the parent's requests (plugin_host/engine_wire.h, the
// public protocol of docs/protocol.md) until the parent closes the socket. Everything that runs
// plugin code runs here, so a crash or a hang in it ends this process only.
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "format/error.h"
#include "plugin_host/engine_wire.h"
#include "plugin_host/isolated_engine.h"

namespace kvdiff::engines {
namespace {

using wire::Op;
using wire::Reply;
using wire::Request;
using wire::Status;

class Server {
 public:
  explicit Server(int fd) : fd_(fd) {}

  // Runs `body` and sends its reply; the plugin's exceptions become error replies.
  template <class Body>
  bool Answer(Body&& body) {
    Reply reply{Status::kOk};
    std::string payload;
    try {
      body(reply, payload);
    } catch (const InputError& e) {
      reply.status = Status::kInputError;
      payload = e.what();
    } catch (const std::exception& e) {
      reply.status = Status::kEngineError;
      payload = e.what();
    }
    reply.bytes = static_cast<int64_t>(payload.size());
    const auto header = wire::EncodeReply(reply);
    return wire::SendAll(fd_, header.data(), header.size()) &&
           wire::SendAll(fd_, payload.data(), payload.size());
  }

  Session& Find(int64_t id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) throw EngineError(fmt::format("engine host: no session {}", id));
    return it->second;
  }
  int64_t Keep(Session session) {
    sessions_.emplace(next_id_, std::move(session));
    return next_id_++;
  }
  void Free(int64_t id) { sessions_.erase(id); }

 private:
  int fd_;
  std::map<int64_t, Session> sessions_;
  int64_t next_id_ = 0;
};

// append_batch's body (wire::BatchItemHeader), read back.
struct BatchBody {
  std::vector<wire::BatchItemHeader> heads;
  Tokens tokens;               // every item's, in item order
  std::vector<uint8_t> flags;  // one per token
};

// nullopt when the items' lengths do not add up to the request's tokens: the parent is then not
// speaking this protocol. (RequestBodyBytes has bounded the counts and sized `body`.)
std::optional<BatchBody> ParseBatch(const Request& request, const std::string& body) {
  BatchBody batch;
  batch.heads.resize(static_cast<size_t>(request.arg));
  batch.tokens.resize(static_cast<size_t>(request.count));
  batch.flags.resize(static_cast<size_t>(request.count));
  const size_t head_bytes = batch.heads.size() * wire::kBatchItemHeaderBytes;
  const size_t token_bytes = batch.tokens.size() * 4;
  for (size_t i = 0; i < batch.heads.size(); ++i) {
    batch.heads[i] = wire::DecodeBatchItemHeader(body.data() + i * wire::kBatchItemHeaderBytes);
  }
  wire::ReadTokens(body.data() + head_bytes, batch.tokens.size(), batch.tokens.data());
  std::memcpy(batch.flags.data(), body.data() + head_bytes + token_bytes, batch.flags.size());
  int64_t left = request.count;
  for (const wire::BatchItemHeader& head : batch.heads) {
    if (head.n < 1 || head.n > left) return std::nullopt;
    left -= head.n;
  }
  if (left != 0) return std::nullopt;
  return batch;
}

// One engines::Engine::AppendBatch call on the sessions `batch` names; the logits of every
// item's flagged rows, item after item, into `payload`. Returns how many rows that is.
int64_t RunBatch(const Engine& engine, Server& server, const BatchBody& batch,
                 std::string& payload) {
  std::vector<BatchItem> items;
  size_t begin = 0;
  for (const wire::BatchItemHeader& head : batch.heads) {
    const size_t end = begin + static_cast<size_t>(head.n);
    BatchItem& item = items.emplace_back();
    item.session = &server.Find(head.session);
    item.tokens.assign(batch.tokens.begin() + begin, batch.tokens.begin() + end);
    item.output.assign(batch.flags.begin() + begin, batch.flags.begin() + end);
    begin = end;
  }
  int64_t rows = 0;
  for (const Logits& logits : engine.AppendBatch(items)) {
    wire::AppendFloats(payload, logits.data(), static_cast<size_t>(logits.size()));
    rows += logits.rows();
  }
  return rows;
}

}  // namespace

int ServeIsolatedEngine(int fd, const std::filesystem::path& plugin_path) {
  Server server(fd);
  std::optional<Engine> engine;
  char header[wire::kRequestHeaderBytes];
  while (wire::ReadAll(fd, header, sizeof header)) {
    const Request request = wire::DecodeRequest(header);
    const int64_t body_bytes = wire::RequestBodyBytes(request);
    if (body_bytes < 0) return 3;  // not our protocol: nothing sensible to answer
    std::string body(static_cast<size_t>(body_bytes), '\0');
    if (!wire::ReadAll(fd, body.data(), body.size())) return 0;
    Tokens tokens;
    if (request.op == Op::kAppend) {
      tokens.resize(static_cast<size_t>(request.count));
      wire::ReadTokens(body.data(), tokens.size(), tokens.data());
    }
    std::optional<BatchBody> batch;
    if (request.op == Op::kAppendBatch) {
      batch = ParseBatch(request, body);
      if (!batch) return 3;
    }
    const bool sent = server.Answer([&](Reply& reply, std::string& payload) {
      if (request.op == Op::kHello) {
        // arg..count is the parent's range of versions (newest, oldest).
        if (request.count > wire::kProtocolVersion || request.arg < wire::kProtocolVersion) {
          throw InputError(fmt::format(
              "kvdiff engine-host speaks protocol version {}; the parent speaks {} to {}",
              wire::kProtocolVersion, request.count, request.arg));
        }
        reply.value = wire::kProtocolVersion;
        return;
      }
      if (request.op == Op::kOpen) {
        const std::string model_dir = body.substr(0, static_cast<size_t>(request.arg));
        const std::string options = body.substr(static_cast<size_t>(request.arg));
        engine.emplace(Plugin::Load(plugin_path).Open(model_dir, options));
        return;
      }
      if (!engine) throw EngineError("engine host: the engine is not open");
      switch (request.op) {
        case Op::kInfo:
          payload = wire::EncodeInfo(engine->Info());
          break;
        case Op::kNewSession:
          reply.value = server.Keep(engine->NewSession());
          break;
        case Op::kFree:
          server.Free(request.session);
          break;
        case Op::kAppend: {
          const Logits logits = server.Find(request.session).Append(tokens);
          reply.value = logits.rows();
          wire::AppendFloats(payload, logits.data(), static_cast<size_t>(logits.size()));
          break;
        }
        case Op::kLength:
          reply.value = server.Find(request.session).Length();
          break;
        case Op::kTruncate:
          server.Find(request.session).Truncate(request.arg);
          break;
        case Op::kFork:
          reply.value = server.Keep(server.Find(request.session).Fork());
          break;
        case Op::kReset:
          server.Find(request.session).Reset();
          break;
        case Op::kShift:
          server.Find(request.session).Shift(request.arg, request.count);
          break;
        case Op::kAppendBatch:
          reply.value = RunBatch(*engine, server, *batch, payload);
          break;
        case Op::kHello:
        case Op::kOpen:
          break;
      }
    });
    if (!sent) return 0;
  }
  return 0;
}

}  // namespace kvdiff::engines
