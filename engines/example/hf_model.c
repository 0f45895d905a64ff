/* config.json + model.safetensors (float32) -> Config + Weights. See hf_model.h. */
#include "hf_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a minimal JSON cursor: objects, arrays, strings without \u escapes, numbers, literals ----
 */

typedef struct {
  const char* p;
  const char* end;
} Json;

static void skip_ws(Json* j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int expect(Json* j, char c) {
  skip_ws(j);
  if (j->p >= j->end || *j->p != c) return -1;
  j->p++;
  return 0;
}

/* Copies a string value (escapes \" \\ \/ only) into out[cap]. */
static int read_string(Json* j, char* out, size_t cap) {
  if (expect(j, '"') != 0) return -1;
  size_t n = 0;
  while (j->p < j->end && *j->p != '"') {
    char c = *j->p++;
    if (c == '\\') {
      if (j->p >= j->end || !strchr("\"\\/", *j->p)) return -1;
      c = *j->p++;
    }
    if (n + 1 >= cap) return -1;
    out[n++] = c;
  }
  out[n] = '\0';
  return expect(j, '"');
}

static int read_number(Json* j, double* out) {
  skip_ws(j);
  char buf[64];
  size_t n = 0;
  while (j->p < j->end && n + 1 < sizeof buf && strchr("+-.0123456789eE", *j->p))
    buf[n++] = *j->p++;
  buf[n] = '\0';
  char* stop = NULL;
  *out = strtod(buf, &stop);
  return (n > 0 && *stop == '\0') ? 0 : -1;
}

static int skip_value(Json* j) {
  skip_ws(j);
  if (j->p >= j->end) return -1;
  char c = *j->p;
  if (c == '"') {
    for (j->p++; j->p < j->end && *j->p != '"'; j->p++)
      if (*j->p == '\\') j->p++;
    return expect(j, '"');
  }
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->p++;
    skip_ws(j);
    if (j->p < j->end && *j->p == close) return j->p++, 0;
    for (;;) {
      if (c == '{' && (skip_value(j) != 0 || expect(j, ':') != 0)) return -1;
      if (skip_value(j) != 0) return -1;
      skip_ws(j);
      if (j->p < j->end && *j->p == ',') {
        j->p++;
        continue;
      }
      return expect(j, close);
    }
  }
  while (j->p < j->end && strchr("+-.0123456789eEtruefalsn", *j->p)) j->p++; /* number, literal */
  return 0;
}

/* Object iteration: call with *first = 1; returns 1 with the next key (cursor at its value),
 * 0 at the closing brace, -1 on malformed text. */
static int next_key(Json* j, char* key, size_t cap, int* first) {
  if (*first) {
    if (expect(j, '{') != 0) return -1;
    skip_ws(j);
    if (j->p < j->end && *j->p == '}') return j->p++, 0;
    *first = 0;
  } else {
    skip_ws(j);
    if (j->p < j->end && *j->p == '}') return j->p++, 0;
    if (expect(j, ',') != 0) return -1;
  }
  if (read_string(j, key, cap) != 0 || expect(j, ':') != 0) return -1;
  return 1;
}

static int is_literal(Json* j, const char* word) {
  skip_ws(j);
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || strncmp(j->p, word, n) != 0) return 0;
  j->p += n;
  return 1;
}

/* ---- errors and files ---- */

static int fail(char* err, size_t size, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(err, size, fmt, args);
  va_end(args);
  return -1;
}

static char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  char* data = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n + 1)) != NULL) {
      if (fread(data, 1, (size_t)n, f) != (size_t)n) {
        free(data);
        data = NULL;
      } else {
        data[n] = '\0';
        *size = (size_t)n;
      }
    }
  }
  fclose(f);
  return data;
}

/* ---- config.json ---- */

static int parse_config(const char* text, size_t size, Config* c, char* err, size_t es) {
  memset(c, 0, sizeof *c);
  c->rope_theta = 10000.0;
  c->rms_eps = 1e-6;
  Json j = {text, text + size};
  char key[128];
  int first = 1, r;
  while ((r = next_key(&j, key, sizeof key, &first)) == 1) {
    int64_t* field = !strcmp(key, "hidden_size")               ? &c->hidden
                     : !strcmp(key, "intermediate_size")       ? &c->inter
                     : !strcmp(key, "num_hidden_layers")       ? &c->layers
                     : !strcmp(key, "num_attention_heads")     ? &c->heads
                     : !strcmp(key, "num_key_value_heads")     ? &c->kv_heads
                     : !strcmp(key, "head_dim")                ? &c->head_dim
                     : !strcmp(key, "vocab_size")              ? &c->vocab
                     : !strcmp(key, "max_position_embeddings") ? &c->max_pos
                                                               : NULL;
    double value;
    if (field) {
      if (read_number(&j, &value) != 0)
        return fail(err, es, "config.json: %s must be a number", key);
      *field = (int64_t)value;
    } else if (!strcmp(key, "rope_theta") || !strcmp(key, "rms_norm_eps")) {
      if (read_number(&j, &value) != 0)
        return fail(err, es, "config.json: %s must be a number", key);
      *(!strcmp(key, "rope_theta") ? &c->rope_theta : &c->rms_eps) = value;
    } else if (!strcmp(key, "tie_word_embeddings")) {
      if (is_literal(&j, "true"))
        c->tie_embeddings = 1;
      else if (!is_literal(&j, "false"))
        return fail(err, es, "config.json: tie_word_embeddings must be true or false");
    } else if (!strcmp(key, "rope_scaling")) {
      /* A template engine keeps RoPE plain; scaling must be refused, never silently ignored. */
      if (!is_literal(&j, "null"))
        return fail(err, es,
                    "config.json: rope_scaling is not supported by the example engine (only null)");
    } else if (skip_value(&j) != 0) {
      return fail(err, es, "config.json: malformed value of \"%s\"", key);
    }
  }
  if (r < 0) return fail(err, es, "config.json: malformed JSON near byte %ld", (long)(j.p - text));
  if (c->kv_heads == 0) c->kv_heads = c->heads;
  if (c->head_dim == 0 && c->heads > 0) c->head_dim = c->hidden / c->heads;
  if (c->hidden <= 0 || c->inter <= 0 || c->layers <= 0 || c->heads <= 0 || c->vocab <= 0 ||
      c->max_pos <= 0)
    return fail(err, es,
                "config.json: hidden_size, intermediate_size, num_hidden_layers, "
                "num_attention_heads, vocab_size and max_position_embeddings must be positive");
  if (c->kv_heads <= 0 || c->heads % c->kv_heads != 0)
    return fail(err, es,
                "config.json: num_key_value_heads %lld must divide num_attention_heads %lld",
                (long long)c->kv_heads, (long long)c->heads);
  if (c->head_dim <= 0 || c->head_dim % 2 != 0)
    return fail(err, es, "config.json: head_dim must be positive and even for RoPE, got %lld",
                (long long)c->head_dim);
  return 0;
}

/* ---- model.safetensors: u64 header length, JSON header, data; float32 tensors only ---- */

/* Finds `name` in the header; checks dtype F32 and the shape; returns a malloc'd copy or NULL. */
static float* load_tensor(const char* file, size_t file_size, const char* name, int64_t rows,
                          int64_t cols, char* err, size_t es) {
  uint64_t header_len;
  memcpy(&header_len, file, 8);
  Json j = {file + 8, file + 8 + header_len};
  const char* data = file + 8 + header_len;
  char key[256], dtype[16];
  int first = 1, r;
  while ((r = next_key(&j, key, sizeof key, &first)) == 1) {
    if (strcmp(key, name) != 0) {
      if (skip_value(&j) != 0) break;
      continue;
    }
    int64_t shape[2] = {0, 0}, ndim = 0;
    double begin = -1, end = -1, v;
    int inner_first = 1, ir;
    dtype[0] = '\0';
    while ((ir = next_key(&j, key, sizeof key, &inner_first)) == 1) {
      if (!strcmp(key, "dtype")) {
        if (read_string(&j, dtype, sizeof dtype) != 0) return NULL;
      } else if (!strcmp(key, "shape") || !strcmp(key, "data_offsets")) {
        int is_shape = !strcmp(key, "shape");
        int64_t count = 0;
        if (expect(&j, '[') != 0) return NULL;
        skip_ws(&j);
        while (j.p < j.end && *j.p != ']') {
          if (count > 0 && expect(&j, ',') != 0) return NULL;
          if (read_number(&j, &v) != 0) return NULL;
          if (is_shape && count < 2) shape[count] = (int64_t)v;
          if (!is_shape && count < 2) *(count == 0 ? &begin : &end) = v;
          count++;
          skip_ws(&j);
        }
        if (expect(&j, ']') != 0) return NULL;
        if (is_shape) ndim = count;
      } else if (skip_value(&j) != 0) {
        return NULL;
      }
    }
    if (ir < 0) break;
    int64_t want_ndim = cols > 0 ? 2 : 1;
    if (strcmp(dtype, "F32") != 0) {
      fail(err, es,
           "model.safetensors: tensor '%s' is %s; the example engine reads F32 only "
           "(write the model with --dtype f32)",
           name, dtype);
      return NULL;
    }
    if (ndim != want_ndim || shape[0] != rows || (cols > 0 && shape[1] != cols)) {
      fail(err, es,
           "model.safetensors: tensor '%s' has %lld dims [%lld, %lld], expected [%lld, %lld]", name,
           (long long)ndim, (long long)shape[0], (long long)shape[1], (long long)rows,
           (long long)cols);
      return NULL;
    }
    size_t count = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    if (begin < 0 || end - begin != (double)(count * 4) ||
        8 + header_len + (size_t)end > file_size) {
      fail(err, es,
           "model.safetensors: tensor '%s' has data_offsets outside the file or of the wrong size",
           name);
      return NULL;
    }
    float* out = malloc(count * sizeof(float));
    if (out)
      memcpy(out, data + (size_t)begin, count * sizeof(float)); /* little-endian host */
    else
      fail(err, es, "out of memory reading tensor '%s'", name);
    return out;
  }
  fail(err, es,
       r < 0 ? "model.safetensors: malformed header" : "model.safetensors: tensor '%s' is missing",
       name);
  return NULL;
}

int hf_load(const char* dir, Config* c, Weights* w, char* err, size_t es) {
  char path[4096];
  size_t size = 0;
  memset(w, 0, sizeof *w);
  snprintf(path, sizeof path, "%s/config.json", dir);
  char* text = read_file(path, &size);
  if (!text) return fail(err, es, "cannot read %s", path);
  int r = parse_config(text, size, c, err, es);
  free(text);
  if (r != 0) return -1;

  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  char* file = read_file(path, &size);
  if (!file) return fail(err, es, "cannot read %s", path);
  uint64_t header_len = 0;
  if (size >= 8) memcpy(&header_len, file, 8);
  if (size < 8 || header_len > size - 8) {
    free(file);
    return fail(err, es, "%s: header length %llu does not fit the file of %zu bytes", path,
                (unsigned long long)header_len, size);
  }
  const int64_t h = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
  int ok = 1;
#define LOAD(dst, name, rows, cols) \
  ok = ok && ((dst) = load_tensor(file, size, name, rows, cols, err, es)) != NULL
  LOAD(w->embed, "model.embed_tokens.weight", c->vocab, h);
  w->layer = calloc((size_t)c->layers, sizeof(LayerWeights));
  if (ok && !w->layer) ok = fail(err, es, "out of memory") == 0;
  for (int64_t l = 0; ok && l < c->layers; l++) {
    LayerWeights* L = &w->layer[l];
    char n[9][128];
    const char* parts[9] = {"input_layernorm",  "self_attn.q_proj", "self_attn.k_proj",
                            "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                            "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    for (int i = 0; i < 9; i++)
      snprintf(n[i], sizeof n[i], "model.layers.%lld.%s.weight", (long long)l, parts[i]);
    LOAD(L->input_norm, n[0], h, 0);
    LOAD(L->wq, n[1], q, h);
    LOAD(L->wk, n[2], kv, h);
    LOAD(L->wv, n[3], kv, h);
    LOAD(L->wo, n[4], h, q);
    LOAD(L->post_norm, n[5], h, 0);
    LOAD(L->gate, n[6], c->inter, h);
    LOAD(L->up, n[7], c->inter, h);
    LOAD(L->down, n[8], h, c->inter);
  }
  LOAD(w->final_norm, "model.norm.weight", h, 0);
  if (c->tie_embeddings)
    w->lm_head = w->embed;
  else
    LOAD(w->lm_head, "lm_head.weight", c->vocab, h);
#undef LOAD
  free(file);
  if (!ok) hf_free(c, w);
  return ok ? 0 : -1;
}

void hf_free(const Config* c, Weights* w) {
  if (w->layer) {
    for (int64_t l = 0; l < c->layers; l++) {
      LayerWeights* L = &w->layer[l];
      float* all[9] = {L->input_norm, L->wq,   L->wk, L->wv,  L->wo,
                       L->post_norm,  L->gate, L->up, L->down};
      for (int i = 0; i < 9; i++) free(all[i]);
    }
  }
  if (w->lm_head != w->embed) free(w->lm_head);
  free(w->embed);
  free(w->final_norm);
  free(w->layer);
  memset(w, 0, sizeof *w);
}
