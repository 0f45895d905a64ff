/* kvdiff engine plugin ABI, version 3. Plain C99: usable from C, C++, Rust (cdylib), Zig.
 *
 * An engine is a shared library exporting ONE symbol:
 *
 *     const kvdiff_engine_api* kvdiff_engine_entry(void);
 *
 * which returns a static table of functions. The table's first member, abi_version, stays first in
 * every version of this ABI, so a loader reads it before anything else and refuses a plugin built
 * against a version it does not know, naming both numbers. Nothing else is exported or required.
 *
 * Versions. Each version only appends members to the table, so a version-N table is a prefix of
 * every later one: a loader reads exactly the members of the version the plugin declares.
 *   1: one session per call (append, truncate, fork, reset).
 *   2: append_batch, appended: several sessions of one engine advance in ONE call, with per-row
 *      output flags, as a serving engine runs many conversations in one forward. A version-1
 *      plugin still loads; kvdiff runs its batch steps one session after another.
 *   3: shift: a context shift (llama.cpp's n_keep/n_discard, StreamingLLM) moves a session's
 *      later positions down. It may be NULL: the engine does not shift, and kvdiff refuses a
 *      scenario with shift steps for it (as for every version-1 and version-2 plugin).
 *
 * The contract mirrors kvdiff's checked session (impl/session.h):
 *   - an engine opens a HuggingFace-layout model directory (config.json + model.safetensors, or
 *     whatever the engine documents) with engine options, and creates sessions;
 *   - a session owns its cache and its position: there is no position argument anywhere.
 *     append(tokens) runs positions length()..length()+n-1 and writes their logits;
 *     truncate(n) forgets positions >= n; fork() is an explicit deep copy that evolves
 *     independently; reset() starts a new conversation (empty cache, position 0).
 *   - A call that fails changes nothing: after a non-OK status the session (or engine) is as it was
 *     before the call, and its error string says what happened.
 *
 * Errors. Every call that can fail returns a kvdiff_status. The object the call was made on owns
 * an error string (engine_error / session_error) describing the last failure, valid until the next
 * call on that object. KVDIFF_INVALID_INPUT is the caller's fault (token out of range, truncate
 * or shift beyond the length, a bad option, an unreadable model): kvdiff reports it as bad input
 * (exit 2). KVDIFF_ENGINE_FAILURE is the engine's (out of memory, an internal error): kvdiff
 * reports it as an engine failure (exit 1). Messages name the argument and both numbers, e.g.
 * "token id 300 at index 2 is out of range for vocab_size 256".
 *
 * Logits. The caller provides the buffer: append() writes n * vocab_size float32 values, row-major
 * [n, vocab_size], into `logits`, whose capacity (in floats) the caller passes; a capacity below
 * n * vocab_size is KVDIFF_INVALID_INPUT and nothing is run. (One contract, no ownership questions:
 * the engine never keeps the pointer.)
 *
 * Options. A NUL-terminated text of key=value items separated by ',' or newlines, e.g.
 * "kv=f16,threads=2". Empty text (or NULL) means defaults. An engine refuses an unknown key or a
 * bad value with KVDIFF_INVALID_INPUT naming it and what it accepts: never ignore an option.
 *
 * Threads. An engine and its sessions are called from one thread at a time (the caller
 * serializes). Sessions must be freed before their engine is closed.
 */
#ifndef KVDIFF_ENGINE_H_
#define KVDIFF_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVDIFF_ENGINE_ABI_VERSION 3u
#define KVDIFF_ENGINE_ABI_VERSION_MIN 1u /* the oldest version a loader of this header runs */
#define KVDIFF_ENGINE_ENTRY_SYMBOL "kvdiff_engine_entry"

typedef enum kvdiff_status {
  KVDIFF_OK = 0,
  KVDIFF_INVALID_INPUT = 1,  /* the caller's input was refused; nothing changed */
  KVDIFF_ENGINE_FAILURE = 2, /* the engine failed; nothing changed (or the object is unusable,
                                which its error string then says) */
} kvdiff_status;

typedef struct kvdiff_engine kvdiff_engine;   /* opaque, defined by the plugin */
typedef struct kvdiff_session kvdiff_session; /* opaque, defined by the plugin */

/* A size at which the engine changes behaviour (a tile, a page, a batch, a threshold): test
 * generators pick lengths around these (n-1, n, n+1) to reach the edges. */
typedef struct kvdiff_size {
  const char* name; /* e.g. "n_ubatch", "kv_page", "attention_query_tile" */
  int64_t value;
} kvdiff_size;

/* What an opened engine reports. Every pointer is owned by the engine, valid until close. */
typedef struct kvdiff_engine_info {
  int64_t vocab_size;      /* columns of every logits row */
  int64_t max_length;      /* the most positions a session can hold */
  const char* cache_dtype; /* element type of the KV cache: "f32", "f16", "bf16", "q8_0", ... */
  const kvdiff_size* sizes;
  size_t num_sizes;
  /* ABI 2 (the caller zeroes the struct, so a version-1 plugin leaves them 0; 0 = no limit): */
  int64_t max_sessions;     /* sessions alive at once, forks included */
  int64_t max_batch_tokens; /* tokens one append or append_batch call takes, all items together */
} kvdiff_engine_info;

/* One session's part of a batched call (ABI 2, append_batch). */
typedef struct kvdiff_batch_item {
  kvdiff_session* session; /* a session of the engine the call is made on */
  const int32_t* tokens;   /* n >= 1 tokens, run at positions length()..length()+n-1 */
  int64_t n;
  const uint8_t* output; /* n flags: non-zero = this row's logits are written; NULL = every row */
} kvdiff_batch_item;

typedef struct kvdiff_engine_api {
  uint32_t abi_version; /* KVDIFF_ENGINE_ABI_VERSION the plugin was built with: ALWAYS FIRST */
  const char* name;     /* short engine name, e.g. "example", "llama.cpp" */
  const char* version;  /* the engine's own version text */

  /* Opens a model. *out is set even on failure (to an engine whose engine_error says why; only
   * out of memory leaves it NULL); the caller always closes a non-NULL *out. */
  kvdiff_status (*open)(const char* model_dir, const char* options, kvdiff_engine** out);
  const char* (*engine_error)(const kvdiff_engine* engine);
  kvdiff_status (*engine_info)(kvdiff_engine* engine, kvdiff_engine_info* out);
  void (*close)(kvdiff_engine* engine); /* NULL is a no-op */

  /* A new empty session (length 0). On failure *out is NULL and engine_error says why. */
  kvdiff_status (*session_new)(kvdiff_engine* engine, kvdiff_session** out);
  /* Runs n >= 1 tokens at positions length()..length()+n-1; writes [n, vocab_size] logits. */
  kvdiff_status (*append)(kvdiff_session* session, const int32_t* tokens, int64_t n, float* logits,
                          int64_t logits_capacity);
  int64_t (*length)(const kvdiff_session* session);
  /* Forgets positions >= length; 0 <= length <= length() or KVDIFF_INVALID_INPUT. */
  kvdiff_status (*truncate)(kvdiff_session* session, int64_t length);
  /* A deep copy of session into *out; on failure *out is NULL and session_error says why. */
  kvdiff_status (*fork)(kvdiff_session* session, kvdiff_session** out);
  kvdiff_status (*reset)(kvdiff_session* session);
  const char* (*session_error)(const kvdiff_session* session);
  void (*session_free)(kvdiff_session* session); /* NULL is a no-op */

  /* ---- ABI 2 ---- */

  /* Runs every item in ONE call: item i's tokens at its own session's next positions, each
   * session attending to its own history only. The sessions are distinct (a session named twice
   * is KVDIFF_INVALID_INPUT) and n_items >= 1. Writes the logits of the flagged rows only, item by
   * item in the order given, each item's rows in token order: [sum of flagged rows, vocab_size]
   * row-major into `logits`, whose capacity (in floats) the caller passes; a capacity below that
   * is KVDIFF_INVALID_INPUT and nothing is run. The call fails as a whole: after a non-OK status
   * every item's session is as it was before the call, and engine_error says why. */
  kvdiff_status (*append_batch)(kvdiff_engine* engine, const kvdiff_batch_item* items,
                                int64_t n_items, float* logits, int64_t logits_capacity);

  /* ---- ABI 3 ---- */

  /* A context shift: forgets positions [keep, keep + discard) and moves positions
   * [keep + discard, length()) down by `discard`; each moved cached key is re-rotated by
   * -discard positions (RoPE is a rotation: R(p - d) = R(-d)·R(p)), values move unchanged, so the
   * session continues as if those keys had been computed at their new positions. Afterwards
   * length() is the old length() - discard and the next append runs at that position.
   * 0 <= keep, 0 <= discard and keep + discard <= length(), else KVDIFF_INVALID_INPUT and nothing
   * changes (compare without overflowing: keep and discard may each be INT64_MAX); discard 0
   * changes nothing. NULL: this engine does not shift. */
  kvdiff_status (*shift)(kvdiff_session* session, int64_t keep, int64_t discard);
} kvdiff_engine_api;

/* The one exported symbol. Plugins define it with KVDIFF_ENGINE_EXPORT. */
typedef const kvdiff_engine_api* (*kvdiff_engine_entry_fn)(void);

#if defined(_WIN32)
#define KVDIFF_ENGINE_EXPORT __declspec(dllexport)
#else
#define KVDIFF_ENGINE_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVDIFF_ENGINE_H_ */
