// The child's side of an isolated engine (`kvdiff engine-host`): loads the plugin, opens the engine
// and answers the parent's requests (plugin_host/engine_wire.h) until the parent closes the socket.
// Everything that runs plugin code runs here, so a crash or a hang in it ends this process only.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <string>

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
    return wire::SendAll(fd_, &reply, sizeof reply) &&
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

}  // namespace

int ServeIsolatedEngine(int fd, const std::filesystem::path& plugin_path,
                        const std::filesystem::path& model_dir, const std::string& options) {
  Server server(fd);
  std::optional<Engine> engine;
  Request request{};
  while (wire::ReadAll(fd, &request, sizeof request)) {
    const int64_t body_bytes = wire::RequestBodyBytes(request);
    if (body_bytes < 0) return 3;  // not our protocol: nothing sensible to answer
    Tokens tokens;
    if (request.op == Op::kAppend) {
      tokens.resize(static_cast<size_t>(request.count));
      if (!wire::ReadAll(fd, tokens.data(), static_cast<size_t>(body_bytes))) return 0;
    }
    const bool sent = server.Answer([&](Reply& reply, std::string& payload) {
      if (request.op == Op::kInfo) {
        engine.emplace(Plugin::Load(plugin_path).Open(model_dir, options));
        payload = wire::EncodeInfo(engine->Info());
        return;
      }
      if (!engine) throw EngineError("engine host: the engine is not open");
      switch (request.op) {
        case Op::kNewSession:
          reply.value = server.Keep(engine->NewSession());
          break;
        case Op::kFree:
          server.Free(request.session);
          break;
        case Op::kAppend: {
          const Logits logits = server.Find(request.session).Append(tokens);
          reply.value = logits.rows();
          payload.assign(reinterpret_cast<const char*>(logits.data()),
                         static_cast<size_t>(logits.size()) * sizeof(float));
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
        case Op::kInfo:
          break;
      }
    });
    if (!sent) return 0;
  }
  return 0;
}

}  // namespace kvdiff::engines
