// A backend that forwards every call to another under its own name, for tests that change one
// call of a real backend (a ForwardFull that refuses long histories, a session that hangs).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "harness/backend/backend.h"

namespace kvdiff::testing {

class WrappedBackend : public harness::Backend {
 public:
  WrappedBackend(std::unique_ptr<harness::Backend> inner, harness::BackendInfo info)
      : inner_(std::move(inner)), info_(std::move(info)) {}
  // A float32 backend of that name.
  WrappedBackend(std::unique_ptr<harness::Backend> inner, std::string name)
      : WrappedBackend(std::move(inner), Float32Named(std::move(name))) {}
  const harness::BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return inner_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return inner_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<harness::BackendSession> NewSession() const override {
    return inner_->NewSession();
  }

 protected:
  const harness::Backend& inner() const { return *inner_; }

 private:
  static harness::BackendInfo Float32Named(std::string name) {
    harness::BackendInfo info;
    info.name = std::move(name);
    info.dtype = "float32";
    return info;
  }
  std::unique_ptr<harness::Backend> inner_;
  harness::BackendInfo info_;
};

}  // namespace kvdiff::testing
