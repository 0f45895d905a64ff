// An in-process model behind the Backend interface, written once for impl and the reference
// (impl_backend.cc, reference_backend.cc), which differ only in what their types call each
// operation. `Ops` says that, and nothing else:
//
//   using Model;    // ForwardFull(tokens, trace) and config()
//   using Session;  // the checked session's state
//   using Cache;    // the raw call's cache; Fork() is its explicit deep copy
//   static Session NewSession(const Model&);
//   static Logits Append(const Model&, Session&, const Tokens&, ForwardTrace*);
//   static int64_t Length(const Session&);  static void Truncate(Session&, int64_t);
//   static Session Fork(const Session&);    static void Reset(Session&);
//   static void Shift(const Model&, Session&, int64_t keep, int64_t discard);
//   static Cache NewCache(const Model&);
//   static int64_t Length(const Cache&);    static void Crop(Cache&, int64_t);
//   static void Clear(Cache&);              static Cache Fork(const Cache&);
//   static Logits Forward(const Model&, const Tokens&, int64_t index_pos, Cache&, ForwardTrace*);
//   static constexpr bool kBatched;         // whether it has a batched forward:
//   static std::vector<Logits> AppendBatch(const Model&, const std::vector<Session*>&,
//                                          const std::vector<BatchItem>&);
//   (without one, Backend::AppendBatch's default runs the items one after another)
//
// (Where Session and Cache are one type, the overloads are one function.) Templates rather than a
// base class, so that only the adapter that instantiates them sees its model's header: LibTorch
// stays behind reference/'s torch-free one, and an Eigen-only build never names it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "format/error.h"
#include "harness/backend/backend.h"

namespace kvdiff::harness {

template <typename Ops>
class ModelSession : public BackendSession {
 public:
  using Model = typename Ops::Model;
  // The session keeps its model alive: a session may outlive the backend that made it.
  ModelSession(std::shared_ptr<const Model> model, typename Ops::Session session)
      : model_(std::move(model)), session_(std::move(session)) {}

  Logits Append(const Tokens& tokens, ForwardTrace* trace) override {
    return Ops::Append(*model_, session_, tokens, trace);
  }
  int64_t Length() const override { return Ops::Length(session_); }
  void Truncate(int64_t length) override { Ops::Truncate(session_, length); }
  std::unique_ptr<BackendSession> Fork() const override {
    return std::make_unique<ModelSession>(model_, Ops::Fork(session_));
  }
  void Reset() override { Ops::Reset(session_); }
  void Shift(int64_t keep, int64_t discard) override {
    Ops::Shift(*model_, session_, keep, discard);
  }
  typename Ops::Session& state() { return session_; }

 private:
  std::shared_ptr<const Model> model_;
  typename Ops::Session session_;
};

template <typename Ops>
class ModelRawCache : public RawCache {
 public:
  explicit ModelRawCache(typename Ops::Cache cache) : cache_(std::move(cache)) {}
  int64_t Length() const override { return Ops::Length(cache_); }
  void Crop(int64_t length) override { Ops::Crop(cache_, length); }
  void Clear() override { Ops::Clear(cache_); }
  std::unique_ptr<RawCache> Fork() const override {
    return std::make_unique<ModelRawCache>(Ops::Fork(cache_));
  }
  typename Ops::Cache& cache() { return cache_; }

 private:
  typename Ops::Cache cache_;
};

template <typename Ops>
class ModelRawModel : public RawModel {
 public:
  explicit ModelRawModel(const typename Ops::Model& model) : model_(model) {}
  std::unique_ptr<RawCache> NewCache() const override {
    return std::make_unique<ModelRawCache<Ops>>(Ops::NewCache(model_));
  }
  Logits Forward(const Tokens& tokens, int64_t index_pos, RawCache& cache,
                 ForwardTrace* trace) const override {
    // Every cache this model hands out is a ModelRawCache<Ops>; the drivers never mix backends.
    return Ops::Forward(model_, tokens, index_pos, static_cast<ModelRawCache<Ops>&>(cache).cache(),
                        trace);
  }

 private:
  const typename Ops::Model& model_;
};

template <typename Ops>
class ModelBackend : public Backend {
 public:
  using Model = typename Ops::Model;
  ModelBackend(BackendInfo info, std::shared_ptr<const Model> model)
      : info_(std::move(info)), model_(std::move(model)), raw_(*model_) {}

  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return model_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return model_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    return std::make_unique<ModelSession<Ops>>(model_, Ops::NewSession(*model_));
  }
  const RawModel* Raw() const override { return &raw_; }
  std::vector<Logits> AppendBatch(const std::vector<BatchItem>& items) const override {
    if constexpr (Ops::kBatched) {
      std::vector<typename Ops::Session*> sessions;
      for (size_t i = 0; i < items.size(); ++i) {
        auto* session = dynamic_cast<ModelSession<Ops>*>(items[i].session);
        KVDIFF_CHECK(session != nullptr, "{}: batch item {} is not a session of this backend",
                     info_.name, i);
        sessions.push_back(&session->state());
      }
      return Ops::AppendBatch(*model_, sessions, items);
    } else {
      return Backend::AppendBatch(items);
    }
  }

 private:
  BackendInfo info_;
  std::shared_ptr<const Model> model_;
  ModelRawModel<Ops> raw_;
};

}  // namespace kvdiff::harness
