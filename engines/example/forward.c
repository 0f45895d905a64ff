/* The example engine's model (forward.h): a plain, slow, readable Llama, one token at a time, one
 * function per block, in the order of ../../../shared/spec/llama-forward.md (step numbers beside
 * the code). The ABI glue that calls it is in llama.c; replace this file with calls into your
 * engine. */
#include "forward.h"

#include <math.h>
#include <string.h>

#include "q8_0.h"

/* out (rows) = W (rows, cols) . x (cols) */
static void matmul(float* out, const float* x, const float* w, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; c++) sum += w[r * cols + c] * x[c];
    out[r] = sum;
  }
}

/* 2. RMSNorm: x * rsqrt(mean(x^2) + eps), then times the weight. The squares are summed in double:
 * in float32 the sum overflows to inf (and the row normalizes to 0) once the row's RMS passes
 * ~1.8e19 / sqrt(n), while x itself is still far inside float32's range; kvdiff check's demanding
 * cases (make-model --scale demanding) build such hidden states. */
static void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const float inv_rms = (float)(1.0 / sqrt(ss / (double)n + eps));
  for (int64_t i = 0; i < n; i++) out[i] = (x[i] * inv_rms) * weight[i];
}

/* 3. RoPE, rotate-half layout: dimension i pairs with i + head_dim/2. Angles in double. */
void rope(float* v, int64_t heads, int64_t head_dim, int64_t pos, const double* inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; i++) {
    const double angle = (double)pos * inv_freq[i];
    const float cos_a = (float)cos(angle), sin_a = (float)sin(angle);
    for (int64_t h = 0; h < heads; h++) {
      float* x = v + h * head_dim;
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * cos_a - x2 * sin_a;
      x[i + half] = x2 * cos_a + x1 * sin_a;
    }
  }
}

/* What the cache keeps of a freshly written (or re-rotated) row of kv_dim values. */
void store_row(const kvdiff_engine* e, float* row, int64_t kv_dim) {
  if (e->kv == KV_Q8_0) q8_0_round_trip(row, kv_dim, e->fault == FAULT_Q8_SCALE);
}

/* 4. Attention of the token at `pos` in layer l: q, k, v, RoPE, append k and v to the cache at
 *    row pos, softmax(q.K^T / sqrt(d)) over keys 0..pos, times V, then o_proj into run.proj. */
static void attention(kvdiff_engine* e, kvdiff_session* s, int64_t l, int64_t pos) {
  const Config* c = &e->config;
  const LayerWeights* w = &e->weights.layer[l];
  RunState* r = &e->run;
  const int64_t d = c->head_dim, kv_dim = c->kv_heads * d, n_rep = c->heads / c->kv_heads;
  float* k = s->key[l] + pos * kv_dim;   /* (kv_dim): this position's cache row */
  float* v = s->value[l] + pos * kv_dim; /* (kv_dim) */
  matmul(r->q, r->xn, w->wq, c->heads * d, c->hidden);
  matmul(k, r->xn, w->wk, kv_dim, c->hidden);
  matmul(v, r->xn, w->wv, kv_dim, c->hidden);
  rope(r->q, c->heads, d, pos, e->inv_freq);
  rope(k, c->kv_heads, d, pos, e->inv_freq);
  store_row(e, k, kv_dim); /* the cache holds what its element type keeps */
  store_row(e, v, kv_dim);
  const float scale = 1.0f / sqrtf((float)d);
  for (int64_t h = 0; h < c->heads; h++) {
    const float* q = r->q + h * d;
    const int64_t kvh = h / n_rep; /* query head h reads KV head h / n_rep */
    float max = -INFINITY, sum = 0.0f;
    for (int64_t t = 0; t <= pos; t++) { /* causal: keys 0..pos */
      const float* kt = s->key[l] + t * kv_dim + kvh * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; i++) dot += q[i] * kt[i];
      r->scores[t] = dot * scale;
      if (r->scores[t] > max) max = r->scores[t];
    }
    for (int64_t t = 0; t <= pos; t++) sum += (r->scores[t] = expf(r->scores[t] - max));
    float* out = r->attn + h * d;
    memset(out, 0, (size_t)d * sizeof(float));
    for (int64_t t = 0; t <= pos; t++) {
      const float* vt = s->value[l] + t * kv_dim + kvh * d;
      const float p = r->scores[t] / sum;
      for (int64_t i = 0; i < d; i++) out[i] += p * vt[i];
    }
  }
  matmul(r->proj, r->attn, w->wo, c->hidden, c->heads * d);
}

/* 5. SwiGLU MLP: down(silu(gate(x)) * up(x)) into run.proj. */
static void mlp(kvdiff_engine* e, int64_t l) {
  const Config* c = &e->config;
  const LayerWeights* w = &e->weights.layer[l];
  RunState* r = &e->run;
  matmul(r->gate, r->xn, w->gate, c->inter, c->hidden);
  matmul(r->up, r->xn, w->up, c->inter, c->hidden);
  for (int64_t i = 0; i < c->inter; i++) {
    const float g = r->gate[i];
    r->gate[i] = g / (1.0f + expf(-g)) * r->up[i]; /* silu(g) * up */
  }
  matmul(r->proj, r->gate, w->down, c->hidden, c->inter);
}

/* The whole model for one token at position pos: caches its keys and values, and writes its
 * logits (vocab) unless `logits` is NULL (a row nobody asked for skips the head). */
void forward(kvdiff_engine* e, kvdiff_session* s, int32_t token, int64_t pos, float* logits) {
  const Config* c = &e->config;
  RunState* r = &e->run;
  const float eps = (float)c->rms_eps;
  memcpy(r->x, e->weights.embed + (int64_t)token * c->hidden,
         (size_t)c->hidden * sizeof(float)); /* 1. */
  for (int64_t l = 0; l < c->layers; l++) {
    /* 6. h = x + Attn(RMSNorm(x)); out = h + MLP(RMSNorm(h)). */
    rmsnorm(r->xn, r->x, e->weights.layer[l].input_norm, c->hidden, eps);
    attention(e, s, l, pos);
    for (int64_t i = 0; i < c->hidden; i++) r->x[i] += r->proj[i];
    rmsnorm(r->xn, r->x, e->weights.layer[l].post_norm, c->hidden, eps);
    mlp(e, l);
    for (int64_t i = 0; i < c->hidden; i++) r->x[i] += r->proj[i];
  }
  if (!logits) return;
  rmsnorm(r->xn, r->x, e->weights.final_norm, c->hidden, eps); /* 7. final norm, then the head */
  matmul(logits, r->xn, e->weights.lm_head, c->vocab, c->hidden);
}
