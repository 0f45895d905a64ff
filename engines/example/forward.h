/* The example engine's state and its forward pass, shared by forward.c (the model: one token at a
 * time, one function per block) and llama.c (the ABI glue: engine, sessions, shift, batch).
 * Internal to the plugin: the library's visibility is hidden, so none of it is exported. */
#ifndef KVDIFF_EXAMPLE_FORWARD_H_
#define KVDIFF_EXAMPLE_FORWARD_H_

#include <stdint.h>

#include "hf_model.h"
#include "kvdiff/engine.h"

/* Scratch buffers of one token's forward pass, shared by the engine's sessions (one thread). */
typedef struct {
  float* x;      /* (hidden): the residual stream */
  float* xn;     /* (hidden): RMSNorm(x) */
  float* q;      /* (heads * head_dim): queries, post-RoPE */
  float* scores; /* (max_length): one head's attention weights */
  float* attn;   /* (heads * head_dim): attention output, heads concatenated */
  float* proj;   /* (hidden): o_proj or down_proj output, before the residual */
  float* gate;   /* (inter) */
  float* up;     /* (inter) */
} RunState;

/* Test-only bugs, chosen with fault=NAME. */
typedef enum { FAULT_NONE, FAULT_SHIFT_NOT_REROTATED, FAULT_Q8_SCALE } Fault;

/* The cache's element type, chosen with kv=. */
typedef enum { KV_F32, KV_Q8_0 } KvType;

struct kvdiff_engine {
  Config config;
  Weights weights;
  int loaded;
  int64_t max_length;
  KvType kv;
  Fault fault;
  double* inv_freq; /* (head_dim / 2): 1 / rope_theta^(2i / head_dim) */
  RunState run;
  char error[1024];
};

struct kvdiff_session {
  kvdiff_engine* engine;
  int64_t length;   /* positions 0..length-1 are cached */
  int64_t capacity; /* positions allocated in key/value */
  float** key;      /* [layers] (capacity, kv_heads * head_dim), post-RoPE */
  float** value;    /* [layers] (capacity, kv_heads * head_dim) */
  char error[1024];
};

/* 3. RoPE of `heads` vectors of head_dim at position pos (negative: the rotation back, as shift
 * turns cached keys). */
void rope(float* v, int64_t heads, int64_t head_dim, int64_t pos, const double* inv_freq);

/* What the cache keeps of a freshly written (or re-rotated) row of kv_dim values. */
void store_row(const kvdiff_engine* e, float* row, int64_t kv_dim);

/* The whole model for one token at position pos: caches its keys and values, and writes its
 * logits (vocab) unless `logits` is NULL (a row nobody asked for skips the head). */
void forward(kvdiff_engine* e, kvdiff_session* s, int32_t token, int64_t pos, float* logits);

#endif /* KVDIFF_EXAMPLE_FORWARD_H_ */
