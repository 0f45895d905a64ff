#include "plugin_host/plugin_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <numeric>

#include "kvdiff/engine.h"
#include "plugin_host/batch_items.h"
#include "plugin_host/engine_text.h"

namespace kvdiff::engines {

struct Library {
  void* handle = nullptr;
  const kvdiff_engine_api* api = nullptr;
  std::filesystem::path path;
  std::string name, version;
  ~Library() {
    if (handle) dlclose(handle);
  }
};

struct EngineState {
  std::shared_ptr<Library> library;
  kvdiff_engine* engine = nullptr;
  EngineInfo info;
  ~EngineState() { library->api->close(engine); }
};

namespace {

// Turns a non-OK status into the exception it stands for; `error` is the object's error string.
void Check(kvdiff_status status, const std::string& engine_name, const char* error) {
  if (status == KVDIFF_OK) return;
  const std::string message =
      fmt::format("{}: {}", engine_name, error ? EngineText(error) : "(no message)");
  if (status == KVDIFF_INVALID_INPUT) throw InputError(message);
  if (status == KVDIFF_ENGINE_FAILURE) throw EngineError(message);
  throw EngineError(
      fmt::format("{} (and an unknown status {})", message, static_cast<int>(status)));
}

const kvdiff_engine_api& Api(const EngineState& e) { return *e.library->api; }

// The error string is read only after the call returned (it describes the last failure).
void CheckEngine(const EngineState& e, kvdiff_status status) {
  if (status != KVDIFF_OK) Check(status, e.info.name, Api(e).engine_error(e.engine));
}
void CheckSession(const EngineState& e, const kvdiff_session* s, kvdiff_status status) {
  if (status != KVDIFF_OK) Check(status, e.info.name, Api(e).session_error(s));
}

}  // namespace

// ---- Plugin ----

Plugin Plugin::Load(const std::filesystem::path& path) {
  auto lib = std::make_shared<Library>();
  lib->path = path;
  // RTLD_LOCAL: two plugins may carry symbols of the same name (their own copies of a library).
  lib->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    throw InputError(fmt::format("cannot load engine plugin {}: {}", path.string(), dlerror()));
  }
  auto entry =
      reinterpret_cast<kvdiff_engine_entry_fn>(dlsym(lib->handle, KVDIFF_ENGINE_ENTRY_SYMBOL));
  if (!entry) {
    throw InputError(fmt::format("{} is not a kvdiff engine plugin: it exports no {} symbol",
                                 path.string(), KVDIFF_ENGINE_ENTRY_SYMBOL));
  }
  lib->api = entry();
  if (!lib->api) {
    throw InputError(
        fmt::format("{}: {}() returned NULL", path.string(), KVDIFF_ENGINE_ENTRY_SYMBOL));
  }
  const uint32_t version = lib->api->abi_version;
  if (version < KVDIFF_ENGINE_ABI_VERSION_MIN || version > KVDIFF_ENGINE_ABI_VERSION) {
    throw InputError(fmt::format(
        "{} was built against kvdiff engine ABI version {}, this kvdiff speaks versions {} to {}: "
        "rebuild the plugin against this kvdiff's include/kvdiff/engine.h",
        path.string(), version, KVDIFF_ENGINE_ABI_VERSION_MIN, KVDIFF_ENGINE_ABI_VERSION));
  }
  // Only the members of the declared version are read: a version-1 table ends at session_free.
  const kvdiff_engine_api& a = *lib->api;
  const bool v2 = version >= 2;
  const std::pair<const char*, bool> members[] = {
      {"name", a.name != nullptr},
      {"version", a.version != nullptr},
      {"open", a.open != nullptr},
      {"engine_error", a.engine_error != nullptr},
      {"engine_info", a.engine_info != nullptr},
      {"close", a.close != nullptr},
      {"session_new", a.session_new != nullptr},
      {"append", a.append != nullptr},
      {"length", a.length != nullptr},
      {"truncate", a.truncate != nullptr},
      {"fork", a.fork != nullptr},
      {"reset", a.reset != nullptr},
      {"session_error", a.session_error != nullptr},
      {"session_free", a.session_free != nullptr},
      {"append_batch (ABI 2)", !v2 || a.append_batch != nullptr},
  };
  for (const auto& [member, present] : members) {
    if (!present) {
      throw InputError(fmt::format("{}: the engine table has no {} (every member is required)",
                                   path.string(), member));
    }
  }
  lib->name = EngineText(a.name);
  lib->version = EngineText(a.version);
  return Plugin(std::move(lib));
}

const std::string& Plugin::Name() const { return library_->name; }
const std::string& Plugin::Version() const { return library_->version; }
const std::filesystem::path& Plugin::Path() const { return library_->path; }

Engine Plugin::Open(const std::filesystem::path& model_dir, const std::string& options) const {
  const kvdiff_engine_api& a = *library_->api;
  kvdiff_engine* raw = nullptr;
  const kvdiff_status status = a.open(model_dir.c_str(), options.c_str(), &raw);
  auto state = std::make_shared<EngineState>();
  state->library = library_;
  state->engine = raw;  // closed by ~EngineState, also when open failed
  if (status == KVDIFF_OK && !raw) {
    throw EngineError(fmt::format("{}: open returned OK and no engine", library_->name));
  }
  if (status != KVDIFF_OK) {
    Check(status, library_->name,
          raw ? a.engine_error(raw) : "out of memory opening the engine (no engine returned)");
  }

  EngineInfo& info = state->info;
  info.name = library_->name;
  kvdiff_engine_info raw_info{};
  CheckEngine(*state, a.engine_info(raw, &raw_info));
  info.version = library_->version;
  info.abi_version = a.abi_version;
  info.vocab_size = raw_info.vocab_size;
  info.max_length = raw_info.max_length;
  info.cache_dtype = raw_info.cache_dtype ? raw_info.cache_dtype : "";
  for (size_t i = 0; i < raw_info.num_sizes; ++i) {
    info.sizes.emplace_back(raw_info.sizes[i].name ? raw_info.sizes[i].name : "",
                            raw_info.sizes[i].value);
  }
  if (a.abi_version >= 2) {
    info.max_sessions = raw_info.max_sessions;
    info.max_batch_tokens = raw_info.max_batch_tokens;
  }
  // Only a version-3 table has the member; NULL there is an engine that does not shift.
  info.shifts = a.abi_version >= 3 && a.shift != nullptr;
  if (info.max_sessions < 0 || info.max_batch_tokens < 0) {
    throw EngineError(fmt::format(
        "{}: engine_info reports max_sessions {} and max_batch_tokens {} (0 for no limit, else "
        "positive)",
        info.name, info.max_sessions, info.max_batch_tokens));
  }
  if (info.vocab_size <= 0 || info.max_length <= 0) {
    throw EngineError(
        fmt::format("{}: engine_info reports vocab_size {} and max_length {} (both "
                    "must be positive)",
                    info.name, info.vocab_size, info.max_length));
  }
  return Engine(std::move(state));
}

// ---- Engine ----

const EngineInfo& Engine::Info() const { return state_->info; }

bool Engine::HasBatch() const { return state_->info.abi_version >= 2; }

std::vector<Logits> Engine::AppendBatch(const std::vector<BatchItem>& items) const {
  const std::string& name = state_->info.name;
  KVDIFF_CHECK(HasBatch(), "{}: a version-{} plugin has no append_batch", name,
               state_->info.abi_version);
  CheckBatchItems(name, items,
                  [&](const Session* s) { return s != nullptr && s->engine_ == state_; });
  const int64_t vocab = state_->info.vocab_size;
  std::vector<kvdiff_batch_item> raw(items.size());
  std::vector<std::vector<uint8_t>> flags(items.size());
  std::vector<int64_t> rows(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    flags[i] = OutputFlags(items[i]);
    rows[i] = FlaggedRows(flags[i]);
    raw[i] = {items[i].session->session_, items[i].tokens.data(),
              static_cast<int64_t>(items[i].tokens.size()), flags[i].data()};
  }
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  Logits all(total, vocab);  // [every item's flagged rows, vocab]
  CheckEngine(*state_, Api(*state_).append_batch(state_->engine, raw.data(),
                                                 static_cast<int64_t>(raw.size()), all.data(),
                                                 total * vocab));
  std::vector<Logits> out;
  int64_t begin = 0;
  for (int64_t n : rows) {
    out.push_back(all.middleRows(begin, n));
    begin += n;
  }
  return out;
}

Session Engine::NewSession() const {
  kvdiff_session* raw = nullptr;
  CheckEngine(*state_, Api(*state_).session_new(state_->engine, &raw));
  if (!raw)
    throw EngineError(fmt::format("{}: session_new returned OK and no session", state_->info.name));
  return Session(state_, raw);
}

// ---- Session ----

Session::Session(std::shared_ptr<EngineState> engine, kvdiff_session* session)
    : engine_(std::move(engine)), session_(session) {}

Session::Session(Session&& other) noexcept
    : engine_(std::move(other.engine_)), session_(std::exchange(other.session_, nullptr)) {}

Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    if (session_) Api(*engine_).session_free(session_);
    engine_ = std::move(other.engine_);
    session_ = std::exchange(other.session_, nullptr);
  }
  return *this;
}

Session::~Session() {
  if (session_) Api(*engine_).session_free(session_);
}

Logits Session::Append(const Tokens& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = engine_->info.vocab_size;
  // An empty call is refused by the engine too; a 0-row matrix must not reach it with data()==NULL.
  KVDIFF_CHECK(n > 0, "{}: tokens is empty (expected at least one token)", engine_->info.name);
  Logits logits(n, vocab);
  CheckSession(*engine_, session_,
               Api(*engine_).append(session_, tokens.data(), n, logits.data(), n * vocab));
  return logits;
}

int64_t Session::Length() const { return Api(*engine_).length(session_); }

void Session::Truncate(int64_t length) {
  CheckSession(*engine_, session_, Api(*engine_).truncate(session_, length));
}

Session Session::Fork() const {
  kvdiff_session* raw = nullptr;
  CheckSession(*engine_, session_, Api(*engine_).fork(session_, &raw));
  if (!raw)
    throw EngineError(fmt::format("{}: fork returned OK and no session", engine_->info.name));
  return Session(engine_, raw);
}

void Session::Reset() { CheckSession(*engine_, session_, Api(*engine_).reset(session_)); }

void Session::Shift(int64_t keep, int64_t discard) {
  KVDIFF_CHECK(engine_->info.shifts, "{}: the engine does not shift (a version-{} plugin{})",
               engine_->info.name, engine_->info.abi_version,
               engine_->info.abi_version >= 3 ? " whose table's shift is NULL" : "");
  CheckSession(*engine_, session_, Api(*engine_).shift(session_, keep, discard));
}

}  // namespace kvdiff::engines
