/* The example kvdiff engine: a plain, slow, readable Llama in C11 behind kvdiff's engine ABI.
 * This file is the ABI glue (the engine, its sessions and KV cache, the context shift, the
 * batched call, the one exported symbol); the model, one token at a time, is in forward.c. Copy
 * this folder to start a plugin for your own engine: keep this file, replace forward.c.
 *
 * Options: max_length=N (positions a session may hold; default and upper bound:
 * max_position_embeddings); kv=f32|q8_0 (the cache's element type, default f32; q8_0 as
 * llama.cpp's, in blocks of 32 values, so the model's head_dim must be a multiple of 32);
 * fault=NAME (TEST-ONLY, default none, to prove kvdiff catches each bug):
 *   shift-not-rerotated  shift moves the cached rows and leaves the keys rotated for their old
 *                        positions;
 *   q8-scale             (kv=q8_0) every block of a cached row is read back with the scale of
 *                        the row's first block, as a dequantizer that indexes its scales by row
 *                        instead of by block. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "hf_model.h"
#include "kvdiff/engine.h"
#include "q8_0.h"

static kvdiff_status set_error(char* buf, kvdiff_status status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, 1024, fmt, args);
  va_end(args);
  return status;
}

/* ---- the engine ---- */

static kvdiff_status parse_options(kvdiff_engine* e, const char* options) {
  const char* p = options ? options : "";
  while (*p) {
    size_t n = strcspn(p, ",\n");
    char item[256];
    if (n >= sizeof item)
      return set_error(e->error, KVDIFF_INVALID_INPUT, "option too long: %.40s...", p);
    memcpy(item, p, n);
    item[n] = '\0';
    p += n + (p[n] != '\0');
    if (n == 0) continue;
    char* eq = strchr(item, '=');
    if (!eq)
      return set_error(e->error, KVDIFF_INVALID_INPUT, "option '%s': expected key=value", item);
    *eq = '\0';
    if (strcmp(item, "max_length") == 0) {
      char* end = NULL;
      long long v = strtoll(eq + 1, &end, 10);
      if (*end != '\0' || v < 1 || v > e->config.max_pos)
        return set_error(
            e->error, KVDIFF_INVALID_INPUT,
            "option max_length=%s: expected an integer in [1, %lld] (max_position_embeddings)",
            eq + 1, (long long)e->config.max_pos);
      e->max_length = v;
    } else if (strcmp(item, "fault") == 0) {
      if (strcmp(eq + 1, "none") == 0) {
        e->fault = FAULT_NONE;
      } else if (strcmp(eq + 1, "shift-not-rerotated") == 0) {
        e->fault = FAULT_SHIFT_NOT_REROTATED;
      } else if (strcmp(eq + 1, "q8-scale") == 0) {
        e->fault = FAULT_Q8_SCALE;
      } else {
        return set_error(e->error, KVDIFF_INVALID_INPUT,
                         "option fault=%s: expected none, shift-not-rerotated or q8-scale", eq + 1);
      }
    } else if (strcmp(item, "kv") == 0) {
      if (strcmp(eq + 1, "f32") == 0) {
        e->kv = KV_F32;
      } else if (strcmp(eq + 1, "q8_0") == 0) {
        e->kv = KV_Q8_0;
      } else {
        return set_error(e->error, KVDIFF_INVALID_INPUT, "option kv=%s: expected f32 or q8_0",
                         eq + 1);
      }
    } else {
      return set_error(e->error, KVDIFF_INVALID_INPUT,
                       "unknown option '%s' (the example engine knows: max_length, kv, fault)",
                       item);
    }
  }
  if (e->fault == FAULT_Q8_SCALE && e->kv != KV_Q8_0)
    return set_error(e->error, KVDIFF_INVALID_INPUT,
                     "option fault=q8-scale needs kv=q8_0 (it is a bug of the q8_0 cache)");
  /* q8_0's blocks must not straddle two heads, so they divide head_dim (llama.cpp refuses the
   * same caches). */
  if (e->kv == KV_Q8_0 && e->config.head_dim % kQ8Block != 0)
    return set_error(e->error, KVDIFF_INVALID_INPUT,
                     "option kv=q8_0: the model's head_dim %lld is not a multiple of q8_0's block "
                     "of %d",
                     (long long)e->config.head_dim, kQ8Block);
  return KVDIFF_OK;
}

static void engine_close(kvdiff_engine* e) {
  if (!e) return;
  if (e->loaded) hf_free(&e->config, &e->weights);
  float* bufs[] = {e->run.x,    e->run.xn,   e->run.q,    e->run.scores,
                   e->run.attn, e->run.proj, e->run.gate, e->run.up};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(e->inv_freq);
  free(e);
}

static kvdiff_status engine_open(const char* model_dir, const char* options, kvdiff_engine** out) {
  kvdiff_engine* e = calloc(1, sizeof *e);
  *out = e;
  if (!e) return KVDIFF_ENGINE_FAILURE;
  if (!model_dir) return set_error(e->error, KVDIFF_INVALID_INPUT, "model_dir is NULL");
  if (hf_load(model_dir, &e->config, &e->weights, e->error, sizeof e->error) != 0)
    return KVDIFF_INVALID_INPUT;
  e->loaded = 1;
  const Config* c = &e->config;
  e->max_length = c->max_pos;
  kvdiff_status st = parse_options(e, options);
  if (st != KVDIFF_OK) return st;
  const int64_t q_dim = c->heads * c->head_dim;
  RunState* r = &e->run;
  r->x = malloc((size_t)c->hidden * sizeof(float));
  r->xn = malloc((size_t)c->hidden * sizeof(float));
  r->q = malloc((size_t)q_dim * sizeof(float));
  r->scores = malloc((size_t)e->max_length * sizeof(float));
  r->attn = malloc((size_t)q_dim * sizeof(float));
  r->proj = malloc((size_t)c->hidden * sizeof(float));
  r->gate = malloc((size_t)c->inter * sizeof(float));
  r->up = malloc((size_t)c->inter * sizeof(float));
  e->inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof(double));
  if (!r->x || !r->xn || !r->q || !r->scores || !r->attn || !r->proj || !r->gate || !r->up ||
      !e->inv_freq)
    return set_error(e->error, KVDIFF_ENGINE_FAILURE, "out of memory allocating the run state");
  for (int64_t i = 0; i < c->head_dim / 2; i++)
    e->inv_freq[i] = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->head_dim);
  return KVDIFF_OK;
}

static const char* engine_error(const kvdiff_engine* e) { return e ? e->error : "engine is NULL"; }

static kvdiff_status engine_info(kvdiff_engine* e, kvdiff_engine_info* out) {
  out->vocab_size = e->config.vocab;
  out->max_length = e->max_length;
  out->cache_dtype = e->kv == KV_Q8_0 ? "q8_0" : "f32"; /* selects kvdiff's tolerance profile */
  out->sizes = NULL; /* one token at a time: no tiles, pages or thresholds */
  out->num_sizes = 0;
  return KVDIFF_OK;
}

/* ---- sessions ---- */

static void session_free(kvdiff_session* s) {
  if (!s) return;
  for (int64_t l = 0; s->key && l < s->engine->config.layers; l++) free(s->key[l]);
  for (int64_t l = 0; s->value && l < s->engine->config.layers; l++) free(s->value[l]);
  free(s->key);
  free(s->value);
  free(s);
}

static kvdiff_status session_new(kvdiff_engine* e, kvdiff_session** out) {
  kvdiff_session* s = calloc(1, sizeof *s);
  *out = NULL;
  if (s) {
    s->engine = e;
    s->key = calloc((size_t)e->config.layers, sizeof(float*));
    s->value = calloc((size_t)e->config.layers, sizeof(float*));
  }
  if (!s || !s->key || !s->value) {
    session_free(s);
    return set_error(e->error, KVDIFF_ENGINE_FAILURE, "out of memory creating a session");
  }
  *out = s;
  return KVDIFF_OK;
}

/* Grows every layer's cache to hold `need` positions; on failure the capacity is unchanged. */
static int reserve(kvdiff_session* s, int64_t need) {
  if (need <= s->capacity) return 0;
  int64_t cap = s->capacity * 2 > need ? s->capacity * 2 : need;
  if (cap > s->engine->max_length) cap = s->engine->max_length;
  const size_t row =
      (size_t)(s->engine->config.kv_heads * s->engine->config.head_dim) * sizeof(float);
  for (int64_t l = 0; l < s->engine->config.layers; l++) {
    float* k = realloc(s->key[l], (size_t)cap * row);
    if (k) s->key[l] = k;
    float* v = realloc(s->value[l], (size_t)cap * row);
    if (v) s->value[l] = v;
    if (!k || !v) return -1;
  }
  s->capacity = cap;
  return 0;
}

/* Whether n tokens may be appended to s: at least one, every id in the vocab, room left in the
 * session. The message goes to `error`, after `where` ("" for append, "batch item 2: " for
 * append_batch). */
static kvdiff_status check_tokens(const kvdiff_session* s, const int32_t* tokens, int64_t n,
                                  char* error, const char* where) {
  const int64_t vocab = s->engine->config.vocab;
  if (n < 1 || !tokens)
    return set_error(error, KVDIFF_INVALID_INPUT, "%stokens is empty (expected at least one token)",
                     where);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return set_error(error, KVDIFF_INVALID_INPUT,
                       "%stoken id %d at index %lld is out of range for vocab_size %lld", where,
                       tokens[i], (long long)i, (long long)vocab);
  if (s->length + n > s->engine->max_length)
    return set_error(error, KVDIFF_INVALID_INPUT,
                     "%ssession holds %lld positions of max_length %lld: %lld more tokens do not "
                     "fit",
                     where, (long long)s->length, (long long)s->engine->max_length, (long long)n);
  return KVDIFF_OK;
}

/* Runs n checked tokens at positions length()..length()+n-1, into a cache with room for them.
 * The logits of the rows `output` flags (every row when it is NULL) are written one after
 * another from `logits`; returns where the next written row would go. */
static float* run_tokens(kvdiff_session* s, const int32_t* tokens, int64_t n, const uint8_t* output,
                         float* logits) {
  const int64_t vocab = s->engine->config.vocab;
  for (int64_t i = 0; i < n; i++) {
    const int wanted = !output || output[i];
    forward(s->engine, s, tokens[i], s->length + i, wanted ? logits : NULL);
    if (wanted) logits += vocab;
  }
  s->length += n;
  return logits;
}

static kvdiff_status append(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits,
                            int64_t logits_capacity) {
  const int64_t vocab = s->engine->config.vocab;
  kvdiff_status st = check_tokens(s, tokens, n, s->error, "");
  if (st != KVDIFF_OK) return st;
  if (!logits || logits_capacity < n * vocab)
    return set_error(s->error, KVDIFF_INVALID_INPUT,
                     "logits buffer holds %lld floats, %lld tokens x vocab %lld need %lld",
                     (long long)logits_capacity, (long long)n, (long long)vocab,
                     (long long)(n * vocab));
  if (reserve(s, s->length + n) != 0)
    return set_error(s->error, KVDIFF_ENGINE_FAILURE,
                     "out of memory growing the KV cache to %lld positions",
                     (long long)(s->length + n));
  run_tokens(s, tokens, n, NULL, logits);
  return KVDIFF_OK;
}

static int64_t length(const kvdiff_session* s) { return s->length; }

static kvdiff_status truncate_to(kvdiff_session* s, int64_t n) {
  if (n < 0 || n > s->length)
    return set_error(s->error, KVDIFF_INVALID_INPUT,
                     "truncate to %lld: expected 0 <= length <= %lld (the session's length)",
                     (long long)n, (long long)s->length);
  s->length = n; /* rows >= n are overwritten by the next append */
  return KVDIFF_OK;
}

/* A context shift (ABI 3): rows [keep + discard, length) of every layer move down to row keep,
 * and each moved key, cached post-RoPE at its old position p, is rotated by -discard positions:
 * R(p - discard) = R(-discard)·R(p), the angles in double as in rope(), the rotation in float32
 * on the cached values, as an engine with a float32 cache does it. Values move unchanged. */
static kvdiff_status shift(kvdiff_session* s, int64_t keep, int64_t discard) {
  if (keep < 0 || discard < 0 || keep > s->length || discard > s->length - keep)
    return set_error(s->error, KVDIFF_INVALID_INPUT,
                     "shift(keep=%lld, discard=%lld): expected 0 <= keep, 0 <= discard and "
                     "keep + discard <= %lld (the session's length)",
                     (long long)keep, (long long)discard, (long long)s->length);
  const Config* c = &s->engine->config;
  const int64_t kv_dim = c->kv_heads * c->head_dim, moved = s->length - keep - discard;
  for (int64_t l = 0; discard > 0 && l < c->layers; l++) {
    float* k = s->key[l] + keep * kv_dim; /* (moved, kv_dim): the moved rows' new place */
    float* v = s->value[l] + keep * kv_dim;
    memmove(k, k + discard * kv_dim, (size_t)(moved * kv_dim) * sizeof(float));
    memmove(v, v + discard * kv_dim, (size_t)(moved * kv_dim) * sizeof(float));
    if (s->engine->fault == FAULT_SHIFT_NOT_REROTATED) continue; /* THE BUG (test-only) */
    for (int64_t t = 0; t < moved; t++) {
      rope(k + t * kv_dim, c->kv_heads, c->head_dim, -discard, s->engine->inv_freq);
      store_row(s->engine, k + t * kv_dim, kv_dim); /* re-quantized, as llama.cpp's K-shift */
    }
  }
  s->length -= discard;
  return KVDIFF_OK;
}

static kvdiff_status fork_session(kvdiff_session* s, kvdiff_session** out) {
  kvdiff_session* f = NULL;
  *out = NULL;
  if (session_new(s->engine, &f) != KVDIFF_OK || reserve(f, s->length > 0 ? s->length : 1) != 0) {
    session_free(f);
    return set_error(s->error, KVDIFF_ENGINE_FAILURE,
                     "out of memory forking a session of %lld positions", (long long)s->length);
  }
  const size_t bytes =
      (size_t)(s->length * s->engine->config.kv_heads * s->engine->config.head_dim) * sizeof(float);
  for (int64_t l = 0; l < s->engine->config.layers; l++) {
    if (bytes) memcpy(f->key[l], s->key[l], bytes);
    if (bytes) memcpy(f->value[l], s->value[l], bytes);
  }
  f->length = s->length;
  *out = f;
  return KVDIFF_OK;
}

static kvdiff_status reset(kvdiff_session* s) {
  s->length = 0;
  return KVDIFF_OK;
}

static const char* session_error(const kvdiff_session* s) {
  return s ? s->error : "session is NULL";
}

/* ---- the batched call (ABI 2) ---- */

/* The rows of `item` whose logits are written. */
static int64_t flagged_rows(const kvdiff_batch_item* item) {
  if (!item->output) return item->n;
  int64_t rows = 0;
  for (int64_t i = 0; i < item->n; i++) rows += item->output[i] != 0;
  return rows;
}

/* Everything append_batch can refuse, before any session changes: the call fails as a whole. */
static kvdiff_status check_batch(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items,
                                 const float* logits, int64_t logits_capacity) {
  if (!items || n_items < 1)
    return set_error(e->error, KVDIFF_INVALID_INPUT,
                     "a batch of %lld items (expected at least one)", (long long)n_items);
  int64_t rows = 0;
  for (int64_t i = 0; i < n_items; i++) {
    const kvdiff_session* s = items[i].session;
    if (!s || s->engine != e)
      return set_error(e->error, KVDIFF_INVALID_INPUT,
                       "batch item %lld is not a session of this engine", (long long)i);
    for (int64_t j = 0; j < i; j++)
      if (items[j].session == s)
        return set_error(e->error, KVDIFF_INVALID_INPUT,
                         "batch items %lld and %lld name the same session", (long long)j,
                         (long long)i);
    char where[64];
    snprintf(where, sizeof where, "batch item %lld: ", (long long)i);
    kvdiff_status st = check_tokens(s, items[i].tokens, items[i].n, e->error, where);
    if (st != KVDIFF_OK) return st;
    rows += flagged_rows(&items[i]);
  }
  const int64_t vocab = e->config.vocab;
  if ((rows > 0 && !logits) || logits_capacity < rows * vocab)
    return set_error(e->error, KVDIFF_INVALID_INPUT,
                     "logits buffer holds %lld floats, %lld flagged rows x vocab %lld need %lld",
                     (long long)logits_capacity, (long long)rows, (long long)vocab,
                     (long long)(rows * vocab));
  return KVDIFF_OK;
}

/* Every item in one call. A serving engine would run all the items' tokens in one forward over a
 * shared cache; the example runs each item through its session's forward, one after another,
 * which gives the same logits: it shows the contract (checks first, flagged rows only, in item
 * order), not batching speed. */
static kvdiff_status append_batch(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items,
                                  float* logits, int64_t logits_capacity) {
  kvdiff_status st = check_batch(e, items, n_items, logits, logits_capacity);
  if (st != KVDIFF_OK) return st;
  /* Grow every cache before running any item: a growth that fails then leaves every session as
   * it was (a larger allocation is not a change anyone can see). */
  for (int64_t i = 0; i < n_items; i++) {
    kvdiff_session* s = items[i].session;
    if (reserve(s, s->length + items[i].n) != 0)
      return set_error(e->error, KVDIFF_ENGINE_FAILURE,
                       "batch item %lld: out of memory growing the KV cache to %lld positions",
                       (long long)i, (long long)(s->length + items[i].n));
  }
  for (int64_t i = 0; i < n_items; i++)
    logits = run_tokens(items[i].session, items[i].tokens, items[i].n, items[i].output, logits);
  return KVDIFF_OK;
}

static const kvdiff_engine_api kApi = {
    .abi_version = KVDIFF_ENGINE_ABI_VERSION, /* always first: the loader checks it */
    .name = "example",
    .version = "1.0",
    .open = engine_open,
    .engine_error = engine_error,
    .engine_info = engine_info,
    .close = engine_close,
    .session_new = session_new,
    .append = append,
    .length = length,
    .truncate = truncate_to,
    .fork = fork_session,
    .reset = reset,
    .session_error = session_error,
    .session_free = session_free,
    .append_batch = append_batch, /* ABI 2 */
    .shift = shift,               /* ABI 3 */
};

KVDIFF_ENGINE_EXPORT const kvdiff_engine_api* kvdiff_engine_entry(void) { return &kApi; }
