// llama.cpp as a kvdiff engine (include/kvdiff/engine.h), over llama.cpp's C API. One llama_context
// per engine; a session is a sequence id in its KV memory:
//   append   -> llama_decode with explicit positions length..length+n-1, logits for every token
//   truncate -> llama_memory_seq_rm(seq, n, -1)
//   fork     -> llama_memory_seq_cp(seq, free_seq) (cells are shared until either side appends)
//   reset    -> llama_memory_seq_rm(seq, -1, -1)
// A model directory in HF layout is converted to GGUF by kvdiff's own writer (format/gguf.h) into a
// cache keyed by a hash of its files; a path to a .gguf file is loaded as it is.
// Files: this one opens the engine, runs the sessions and exports the table; engine_state.h holds
// what an engine and a session are; options.cc parses the options; gguf_cache.cc converts and
// caches.
//
// Options (key=value, ',' or newline separated):
//   kv=f32|f16|q8_0     KV cache type (default f32: the only one held to the 1e-4 gate)
//   flash_attn=on|off   default off: llama.cpp's flash attention casts K/V to F16 even with an f32
//                       cache, which moves logits by ~1e-3
//   threads=N           default 1
//   weights=f32|bf16|f16  the dtype of the weights in the GGUF converted from an HF directory
//                       (default f32); llama.cpp computes in float32 either way
//   max_length=N        positions one session may hold (default min(context_length, 2048))
//   sessions=N          sequences alive at once, forks included (default 8)
//   ubatch=N            llama.cpp's physical batch (default min(max_length, 512)): an append longer
//                       than this runs in several passes
#include <fmt/format.h>
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "engines/llama_cpp/engine_state.h"
#include "engines/llama_cpp/gguf_cache.h"
#include "format/error.h"
#include "format/gguf.h"
#include "kvdiff/engine.h"

namespace kvdiff::llama_cpp {
namespace {

// llama.cpp logs through one global callback: keep the last error line for our messages and drop
// the chatter (KVDIFF_LLAMACPP_LOG=1 prints everything).
std::mutex g_log_mutex;
std::string g_last_log_error;

void LogCallback(ggml_log_level level, const char* text, void*) {
  static const bool verbose = std::getenv("KVDIFF_LLAMACPP_LOG") != nullptr;
  if (verbose) std::fputs(text, stderr);
  if (level == GGML_LOG_LEVEL_ERROR) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_last_log_error = text;
    while (!g_last_log_error.empty() && g_last_log_error.back() == '\n')
      g_last_log_error.pop_back();
  }
}

void InitOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    llama_log_set(LogCallback, nullptr);
    llama_backend_init();
  });
}

}  // namespace

std::string LastLogError() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_last_log_error.empty() ? "" : " (" + g_last_log_error + ")";
}

namespace {

void Open(kvdiff_engine* e, const char* model_dir) {
  InitOnce();
  if (!model_dir) throw kvdiff::InputError("model_dir is NULL");
  const std::filesystem::path gguf = GgufFor(model_dir, e->options.weights);
  // llama.cpp aborts the process on some hyperparameters (0 layers, a NaN epsilon): refuse them
  // first, with the key named; then a cache entry must still be the bytes kvdiff wrote.
  kvdiff::format::CheckLlamaGgufHyperparameters(kvdiff::format::ReadGgufHeader(gguf), gguf);
  if (gguf != std::filesystem::path(model_dir)) CheckCacheEntry(gguf);
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  e->model = llama_model_load_from_file(gguf.c_str(), mp);
  if (!e->model)
    throw kvdiff::InputError(fmt::format("cannot load {}{}", gguf.string(), LastLogError()));
  e->vocab = llama_vocab_n_tokens(llama_model_get_vocab(e->model));
  const int64_t n_ctx_train = llama_model_n_ctx_train(e->model);
  const Options& o = e->options;
  e->max_length = o.max_length ? o.max_length : std::min<int64_t>(n_ctx_train, 2048);
  if (e->max_length > n_ctx_train) {
    throw kvdiff::InputError(
        fmt::format("option max_length={} is more than the model's context_length {}",
                    e->max_length, n_ctx_train));
  }
  const int64_t ubatch =
      o.ubatch ? std::min(o.ubatch, e->max_length) : std::min<int64_t>(e->max_length, 512);

  if (o.kv == "q8_0") {
    // q8_0 packs rows in blocks of 32: llama.cpp refuses a cache whose head_dim it does not
    // divide. A bad option for this model is the caller's to fix, so it is bad input here.
    char text[32] = {};
    const int64_t head_dim =
        llama_model_meta_val_str(e->model, "llama.attention.key_length", text, sizeof text) > 0
            ? std::atoll(text)
            : llama_model_n_embd(e->model) / llama_model_n_head(e->model);
    if (head_dim % 32 != 0) {
      throw kvdiff::InputError(fmt::format(
          "option kv=q8_0: the model's head_dim {} is not a multiple of q8_0's block of 32",
          head_dim));
    }
  }

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(e->max_length * o.sessions);  // cells, shared by the sequences
  cp.n_batch = static_cast<uint32_t>(e->max_length);             // the longest append
  cp.n_ubatch = static_cast<uint32_t>(ubatch);
  cp.n_seq_max = static_cast<uint32_t>(o.sessions);
  cp.n_threads = cp.n_threads_batch = o.threads;
  cp.flash_attn_type =
      o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  const ggml_type kv = o.kv == "f32"   ? GGML_TYPE_F32
                       : o.kv == "f16" ? GGML_TYPE_F16
                                       : GGML_TYPE_Q8_0;
  cp.type_k = cp.type_v = kv;
  cp.kv_unified = true;  // one pool of cells, so a fork shares its prefix's cells
  cp.no_perf = true;
  e->ctx = llama_init_from_model(e->model, cp);
  if (!e->ctx)
    throw kvdiff::EngineError(fmt::format("cannot create a llama.cpp context{}", LastLogError()));
  e->seq_used.assign(o.sessions, false);
  // What K/V are attended in: flash attention casts an f32 cache to F16 (and kvdiff picks its
  // tolerance profile from this).
  e->cache_dtype = o.flash_attn && o.kv == "f32" ? "f16" : o.kv;
  e->sizes = {{"n_ubatch", static_cast<int64_t>(llama_n_ubatch(e->ctx))},
              {"n_batch", static_cast<int64_t>(llama_n_batch(e->ctx))},
              {"n_ctx", static_cast<int64_t>(llama_n_ctx(e->ctx))}};
}

llama_seq_id TakeSeq(kvdiff_engine* e) {
  for (size_t i = 0; i < e->seq_used.size(); ++i) {
    if (!e->seq_used[i]) {
      e->seq_used[i] = true;
      return static_cast<llama_seq_id>(i);
    }
  }
  throw kvdiff::InputError(fmt::format(
      "all {} sequences are in use (sessions and forks alive at once); open the engine with a "
      "larger sessions=N",
      e->seq_used.size()));
}

void Append(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits, int64_t capacity) {
  kvdiff_engine* e = s->engine;
  if (n < 1 || !tokens) throw kvdiff::InputError("tokens is empty (expected at least one token)");
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= e->vocab) {
      throw kvdiff::InputError(fmt::format(
          "token id {} at index {} is out of range for vocab_size {}", tokens[i], i, e->vocab));
    }
  }
  if (!logits || capacity < n * e->vocab) {
    throw kvdiff::InputError(
        fmt::format("logits buffer holds {} floats, {} tokens x vocab {} need {}", capacity, n,
                    e->vocab, n * e->vocab));
  }
  if (s->length + n > e->max_length) {
    throw kvdiff::InputError(
        fmt::format("session holds {} positions of max_length {}: {} more tokens do not fit",
                    s->length, e->max_length, n));
  }
  llama_batch batch = llama_batch_init(static_cast<int32_t>(n), 0, 1);
  for (int64_t i = 0; i < n; ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = static_cast<llama_pos>(s->length + i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = s->seq;
    batch.logits[i] = 1;  // logits for every new position
  }
  batch.n_tokens = static_cast<int32_t>(n);
  const int32_t status = llama_decode(e->ctx, batch);
  llama_batch_free(batch);
  if (status != 0) {
    // Whatever ubatches were processed stay in memory on some failures: drop them.
    llama_memory_seq_rm(Memory(e), s->seq, static_cast<llama_pos>(s->length), -1);
    throw kvdiff::EngineError(fmt::format("llama_decode of {} tokens at position {} returned {}{}",
                                          n, s->length, status, LastLogError()));
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* row = llama_get_logits_ith(e->ctx, static_cast<int32_t>(i));
    if (!row) throw kvdiff::EngineError(fmt::format("llama.cpp returned no logits for row {}", i));
    std::memcpy(logits + i * e->vocab, row, static_cast<size_t>(e->vocab) * sizeof(float));
  }
  s->length += n;
}

// ---- the C ABI ----

kvdiff_status EngineOpen(const char* model_dir, const char* options, kvdiff_engine** out) {
  kvdiff_engine* e = new (std::nothrow) kvdiff_engine();
  *out = e;
  if (!e) return KVDIFF_ENGINE_FAILURE;
  return Guard(e->error, [&] {
    e->options = ParseOptions(options);
    Open(e, model_dir);
  });
}

const char* EngineErrorText(const kvdiff_engine* e) {
  return e ? e->error.c_str() : "engine is NULL";
}

kvdiff_status EngineInfo(kvdiff_engine* e, kvdiff_engine_info* out) {
  out->vocab_size = e->vocab;
  out->max_length = e->max_length;
  out->cache_dtype = e->cache_dtype.c_str();
  out->sizes = e->sizes.data();
  out->num_sizes = e->sizes.size();
  return KVDIFF_OK;
}

void EngineClose(kvdiff_engine* e) { delete e; }

kvdiff_status SessionNew(kvdiff_engine* e, kvdiff_session** out) {
  *out = nullptr;
  return Guard(e->error, [&] {
    const llama_seq_id seq = TakeSeq(e);
    llama_memory_seq_rm(Memory(e), seq, -1, -1);
    *out = new kvdiff_session{e, seq, 0, {}};
  });
}

kvdiff_status SessionAppend(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits,
                            int64_t capacity) {
  return Guard(s->error, [&] { Append(s, tokens, n, logits, capacity); });
}

int64_t SessionLength(const kvdiff_session* s) { return s->length; }

kvdiff_status SessionTruncate(kvdiff_session* s, int64_t length) {
  return Guard(s->error, [&] {
    if (length < 0 || length > s->length) {
      throw kvdiff::InputError(fmt::format(
          "truncate to {}: expected 0 <= length <= {} (the session's length)", length, s->length));
    }
    if (!llama_memory_seq_rm(Memory(s->engine), s->seq, static_cast<llama_pos>(length), -1)) {
      throw kvdiff::EngineError(
          fmt::format("llama_memory_seq_rm(seq {}, {}, -1) failed", s->seq, length));
    }
    s->length = length;
  });
}

kvdiff_status SessionFork(kvdiff_session* s, kvdiff_session** out) {
  *out = nullptr;
  return Guard(s->error, [&] {
    const llama_seq_id seq = TakeSeq(s->engine);
    llama_memory_seq_rm(Memory(s->engine), seq, -1, -1);
    llama_memory_seq_cp(Memory(s->engine), s->seq, seq, -1, -1);
    *out = new kvdiff_session{s->engine, seq, s->length, {}};
  });
}

kvdiff_status SessionReset(kvdiff_session* s) {
  return Guard(s->error, [&] {
    llama_memory_seq_rm(Memory(s->engine), s->seq, -1, -1);
    s->length = 0;
  });
}

const char* SessionErrorText(const kvdiff_session* s) {
  return s ? s->error.c_str() : "session is NULL";
}

void SessionFree(kvdiff_session* s) {
  if (!s) return;
  llama_memory_seq_rm(Memory(s->engine), s->seq, -1, -1);
  s->engine->seq_used[s->seq] = false;
  delete s;
}

const std::string kVersion = fmt::format("llama.cpp {} (node-llama-cpp {})", KVDIFF_LLAMACPP_COMMIT,
                                         KVDIFF_LLAMACPP_VERSION);

const kvdiff_engine_api kApi = {
    1u, /* ABI 2 (append_batch) to come */
    "llama.cpp", kVersion.c_str(), EngineOpen,       EngineErrorText, EngineInfo,
    EngineClose, SessionNew,       SessionAppend,    SessionLength,   SessionTruncate,
    SessionFork, SessionReset,     SessionErrorText, SessionFree,
};

}  // namespace
}  // namespace kvdiff::llama_cpp

extern "C" KVDIFF_ENGINE_EXPORT const kvdiff_engine_api* kvdiff_engine_entry(void) {
  return &kvdiff::llama_cpp::kApi;
}
