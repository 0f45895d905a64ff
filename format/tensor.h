// Plain value types every backend speaks: tokens, logits, per-layer traces.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

namespace kvdiff {

using Token = int32_t;
using Tokens = std::vector<Token>;

// Row-major [n, cols] float matrix: one row per input position (logits: cols = vocab).
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Logits = RowMatrix;

// Hidden states of one decoder layer for the rows of one forward call, for --localize.
struct LayerTrace {
  RowMatrix after_attention;  // (n, hidden): x + Attn(RMSNorm(x))
  RowMatrix after_mlp;        // (n, hidden): the layer's output
};

// Filled by a forward call when the caller passes one: layers[l] for l < num_hidden_layers.
struct ForwardTrace {
  std::vector<LayerTrace> layers;
};

}  // namespace kvdiff
