// Backends: every model implementation offered to the harness through one interface, so the
// harness never asks which one it holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/model_files.h"
#include "format/tensor.h"

namespace kvdiff::harness {

class BackendSession {
 public:
  virtual ~BackendSession() = default;
  virtual Logits Append(const Tokens& tokens, ForwardTrace* trace = nullptr) = 0;
  virtual int64_t Length() const = 0;
  virtual void Truncate(int64_t length) = 0;
  virtual std::unique_ptr<BackendSession> Fork() const = 0;
  virtual void Reset() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;  // "impl", "ref", "ref64"
  virtual const format::LlamaConfig& config() const = 0;
  virtual Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace = nullptr) const = 0;
  virtual std::unique_ptr<BackendSession> NewSession() const = 0;
};

// "impl", "ref", "ref64" (the last two only when built with LibTorch; otherwise InputError saying so).
std::unique_ptr<Backend> MakeBackend(const std::string& name,
                                     std::shared_ptr<const format::ModelWeights> weights,
                                     int threads = 0);
std::vector<std::string> AvailableBackends();

}  // namespace kvdiff::harness
