// llama.cpp as a kvdiff engine (include/kvdiff/engine.h, ABI 2), over llama.cpp's C API. One
// llama_context per engine, with one unified KV memory; a session is a sequence id in it:
//   append       -> llama_decode with explicit positions length..length+n-1, logits for every token
//   append_batch -> ONE llama_decode for every item: each item's tokens under its session's
//                   sequence id at its own positions, logits only where flagged (as llama.cpp's
//                   server decodes its slots), so llama.cpp splits it into n_ubatch micro-batches
//   truncate     -> llama_memory_seq_rm(seq, n, -1)
//   fork         -> llama_memory_seq_cp(seq, free_seq) (cells are shared until either side appends)
//   reset        -> llama_memory_seq_rm(seq, -1, -1)
// A model directory in HF layout is converted to GGUF by kvdiff's own writer (format/gguf.h) into a
// cache keyed by a hash of its files; a path to a .gguf file is loaded as it is.
// Files: this one opens the engine, keeps the sessions and exports the table; decode.cc runs both
// appends; engine_state.h holds what an engine and a session are; options.cc parses the options;
// gguf_cache.cc converts and caches.
//
// Options (key=value, ',' or newline separated):
//   kv=f32|f16|q8_0|q4_0  KV cache type (default f32: the only one held to the 1e-4 gate); the
//                       quantized ones need flash_attn=on and a head_dim that is a multiple of 32
//   flash_attn=on|off   default off: llama.cpp's flash attention casts K/V to F16 even with an f32
//                       cache, which moves logits by ~1e-3
//   threads=N           default 1
//   weights=f32|bf16|f16  the dtype of the weights in the GGUF converted from an HF directory
//                       (default f32); with bf16 weights ggml's CPU matmul rounds each
//                       activation to bf16 too (kvdiff's registry declares compute dtype bf16)
//   max_length=N        positions one session may hold (default min(context_length, 2048))
//   sessions=N          sequences alive at once, forks included (default 8, 1 to 64); the context
//                       has max_length x sessions cells
//   batch=N             n_batch, the most tokens one call takes, all items of append_batch together
//                       (default and most max_length x sessions; at least max_length)
//   ubatch=N            n_ubatch, llama.cpp's micro-batch (default min(max_length, 512); 1 to
//                       n_batch): a longer call runs in several passes, a batched one splitting
//                       across items. n_ubatch, n_batch and n_ctx are reported as interesting
//                       sizes.
//   fault=NAME          TEST-ONLY, default none: a bug in append_batch, for proving that kvdiff's
//                       batch checks catch it (decode.cc): batch-shared-positions (item 0's
//                       position vector read by every item), batch-rows-swapped (items 0 and 1 get
//                       each other's first output row), batch-one-seq (every token under item 0's
//                       sequence id). Single appends are never faulty.
#include <fmt/format.h>
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "engines/llama_cpp/decode.h"
#include "engines/llama_cpp/engine_state.h"
#include "engines/llama_cpp/gguf_cache.h"
#include "engines/llama_cpp/shift.h"
#include "format/error.h"
#include "format/gguf.h"
#include "kvdiff/engine.h"

namespace kvdiff::llama_cpp {
namespace {

// llama.cpp logs through one global callback and says why a call failed only there: keep the error
// lines since the call began for our messages, and drop the chatter (KVDIFF_LLAMACPP_LOG=1 prints
// everything).
std::mutex g_log_mutex;
std::string g_log_errors;  // "line; line; ..."

void LogCallback(ggml_log_level level, const char* text, void*) {
  static const bool verbose = std::getenv("KVDIFF_LLAMACPP_LOG") != nullptr;
  if (verbose) std::fputs(text, stderr);
  if (level == GGML_LOG_LEVEL_ERROR) {
    std::string line;  // one line, though some messages span several
    for (const char* c = text; *c; ++c) {
      if (*c != '\n')
        line += *c;
      else if (c[1] != '\0' && !line.empty() && line.back() != ' ')
        line += ' ';
    }
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_log_errors += (g_log_errors.empty() ? "" : "; ") + line;
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

void ForgetLogErrors() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_errors.clear();
}

std::string LastLogError() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_log_errors.empty() ? "" : " (" + g_log_errors + ")";
}

namespace {

void Open(kvdiff_engine* e, const char* model_dir) {
  InitOnce();
  ForgetLogErrors();
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
  // One call carries at most n_batch tokens (llama.cpp aborts the process beyond it, so append and
  // append_batch refuse more first). By default every session's whole length fits one call.
  const int64_t cells = e->max_length * o.sessions;
  const int64_t n_batch = o.batch ? o.batch : cells;
  if (n_batch < e->max_length || n_batch > cells) {
    throw kvdiff::InputError(fmt::format(
        "option batch={}: expected max_length {} <= batch <= max_length x sessions {} (a session's "
        "longest append is one call, and a call holds no more tokens than the context has cells)",
        n_batch, e->max_length, cells));
  }
  if (o.ubatch > n_batch) {
    throw kvdiff::InputError(
        fmt::format("option ubatch={} is more than n_batch {} (option batch)", o.ubatch, n_batch));
  }
  const int64_t ubatch = o.ubatch ? o.ubatch : std::min<int64_t>(e->max_length, 512);

  if (IsQuantized(o.kv)) {
    // q8_0 and q4_0 pack rows in blocks of 32: llama.cpp refuses a cache whose head_dim it does
    // not divide. A bad option for this model is the caller's to fix, so it is bad input here.
    char text[32] = {};
    const int64_t head_dim =
        llama_model_meta_val_str(e->model, "llama.attention.key_length", text, sizeof text) > 0
            ? std::atoll(text)
            : llama_model_n_embd(e->model) / llama_model_n_head(e->model);
    if (head_dim % 32 != 0) {
      throw kvdiff::InputError(
          fmt::format("option kv={}: the model's head_dim {} is not a multiple of {}'s block of 32",
                      o.kv, head_dim, o.kv));
    }
  }

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(cells);  // shared by the sequences
  cp.n_batch = static_cast<uint32_t>(n_batch);
  e->n_batch = n_batch;
  cp.n_ubatch = static_cast<uint32_t>(ubatch);
  cp.n_seq_max = static_cast<uint32_t>(o.sessions);
  cp.n_threads = cp.n_threads_batch = o.threads;
  cp.flash_attn_type =
      o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  const ggml_type kv = o.kv == "f32"    ? GGML_TYPE_F32
                       : o.kv == "f16"  ? GGML_TYPE_F16
                       : o.kv == "q8_0" ? GGML_TYPE_Q8_0
                                        : GGML_TYPE_Q4_0;
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
  out->max_sessions = static_cast<int64_t>(e->seq_used.size());
  out->max_batch_tokens = e->n_batch;
  return KVDIFF_OK;
}

void EngineClose(kvdiff_engine* e) { delete e; }

kvdiff_status SessionNew(kvdiff_engine* e, kvdiff_session** out) {
  *out = nullptr;
  return Guard(e->error, [&] {
    const llama_seq_id seq = TakeSeq(e);
    llama_memory_seq_rm(Memory(e), seq, -1, -1);
    *out = new kvdiff_session{e, seq, 0, false, -1, {}};
  });
}

kvdiff_status SessionAppend(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits,
                            int64_t capacity) {
  return Guard(s->error, [&] { Append(s, tokens, n, logits, capacity); });
}

kvdiff_status EngineAppendBatch(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items,
                                float* logits, int64_t capacity) {
  return Guard(e->error, [&] { AppendBatch(e, items, n_items, logits, capacity); });
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
    *out = new kvdiff_session{s->engine, seq, s->length, true, s->shifted_at, {}};
    s->may_share = true;
  });
}

kvdiff_status SessionReset(kvdiff_session* s) {
  return Guard(s->error, [&] {
    llama_memory_seq_rm(Memory(s->engine), s->seq, -1, -1);
    s->length = 0;
    s->may_share = false;
    s->shifted_at = -1;
  });
}

kvdiff_status SessionShift(kvdiff_session* s, int64_t keep, int64_t discard) {
  return Guard(s->error, [&] { Shift(s, keep, discard); });
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
    KVDIFF_ENGINE_ABI_VERSION,  // 3: shift is the last member
    "llama.cpp",
    kVersion.c_str(),
    EngineOpen,
    EngineErrorText,
    EngineInfo,
    EngineClose,
    SessionNew,
    SessionAppend,
    SessionLength,
    SessionTruncate,
    SessionFork,
    SessionReset,
    SessionErrorText,
    SessionFree,
    EngineAppendBatch,
    SessionShift,
};

}  // namespace
}  // namespace kvdiff::llama_cpp

extern "C" KVDIFF_ENGINE_EXPORT const kvdiff_engine_api* kvdiff_engine_entry(void) {
  return &kvdiff::llama_cpp::kApi;
}
