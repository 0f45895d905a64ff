// The backends behind one interface. "impl" wraps the Eigen Model/Session; "ref" and "ref64" come
// from harness/reference_backend (LibTorch), present only in a build with KVDIFF_WITH_TORCH.
#include "harness/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "format/error.h"
#include "impl/model.h"
#include "impl/session.h"
#ifdef KVDIFF_HAVE_TORCH
#include "harness/reference_backend.h"
#endif

namespace kvdiff::harness {
namespace {

class ImplSession : public BackendSession {
 public:
  // The session keeps its model alive: a session may outlive the backend that made it.
  ImplSession(std::shared_ptr<const impl::Model> model, impl::Session session)
      : model_(std::move(model)), session_(std::move(session)) {}

  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    return session_.Append(tokens, trace);
  }
  int64_t Length() const override { return session_.Length(); }
  void Truncate(int64_t length) override { session_.Truncate(length); }
  std::unique_ptr<BackendSession> Fork() const override {
    return std::make_unique<ImplSession>(model_, session_.Fork());
  }
  void Reset() override { session_.Reset(); }

 private:
  std::shared_ptr<const impl::Model> model_;
  impl::Session session_;
};

class ImplBackend : public Backend {
 public:
  explicit ImplBackend(std::shared_ptr<const impl::Model> model) : model_(std::move(model)) {}

  std::string Name() const override { return "impl"; }
  const format::LlamaConfig& config() const override { return model_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<ImplSession>(model_, model_->NewSession());
  }

 private:
  std::shared_ptr<const impl::Model> model_;
};

}  // namespace

std::vector<std::string> AvailableBackends() {
#ifdef KVDIFF_HAVE_TORCH
  return {"impl", "ref", "ref64"};
#else
  return {"impl"};
#endif
}

std::unique_ptr<Backend> MakeBackend(const std::string& name,
                                     std::shared_ptr<const format::ModelWeights> weights,
                                     int threads) {
  if (name == "impl") {
    return std::make_unique<ImplBackend>(
        std::make_shared<const impl::Model>(std::move(weights), threads));
  }
  if (name == "ref" || name == "ref64") {
#ifdef KVDIFF_HAVE_TORCH
    return MakeReferenceBackend(name, std::move(weights), threads);
#else
    throw InputError(fmt::format(
        "backend '{}' needs a build with LibTorch (KVDIFF_WITH_TORCH=ON); this build has: {}", name,
        fmt::join(AvailableBackends(), ", ")));
#endif
  }
  throw InputError(fmt::format("unknown backend '{}' (available: {})", name,
                               fmt::join(AvailableBackends(), ", ")));
}

}  // namespace kvdiff::harness
