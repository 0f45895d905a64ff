/* Reading a HuggingFace Llama directory in plain C: config.json and a float32 model.safetensors.
 * Just enough JSON for those two files; anything this reader does not understand is refused with
 * a message, never guessed. */
#ifndef KVDIFF_EXAMPLE_HF_MODEL_H_
#define KVDIFF_EXAMPLE_HF_MODEL_H_

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t hidden;     /* hidden_size */
  int64_t inter;      /* intermediate_size */
  int64_t layers;     /* num_hidden_layers */
  int64_t heads;      /* num_attention_heads */
  int64_t kv_heads;   /* num_key_value_heads */
  int64_t head_dim;   /* head_dim, or hidden / heads */
  int64_t vocab;      /* vocab_size */
  int64_t max_pos;    /* max_position_embeddings */
  double rope_theta;  /* rope_theta (10000) */
  double rms_eps;     /* rms_norm_eps (1e-6, transformers' default) */
  int tie_embeddings; /* tie_word_embeddings: lm_head is the embedding */
} Config;

typedef struct {
  float* input_norm; /* (hidden) */
  float* wq;         /* (heads * head_dim, hidden) */
  float* wk;         /* (kv_heads * head_dim, hidden) */
  float* wv;         /* (kv_heads * head_dim, hidden) */
  float* wo;         /* (hidden, heads * head_dim) */
  float* post_norm;  /* (hidden) */
  float* gate;       /* (inter, hidden) */
  float* up;         /* (inter, hidden) */
  float* down;       /* (hidden, inter) */
} LayerWeights;

typedef struct {
  float* embed;        /* (vocab, hidden) */
  LayerWeights* layer; /* [layers] */
  float* final_norm;   /* (hidden) */
  float* lm_head;      /* (vocab, hidden); == embed when tied */
} Weights;

/* Reads DIR/config.json and DIR/model.safetensors. Returns 0, or -1 with a message in err. */
int hf_load(const char* dir, Config* config, Weights* weights, char* err, size_t err_size);
void hf_free(const Config* config, Weights* weights);

#endif /* KVDIFF_EXAMPLE_HF_MODEL_H_ */
