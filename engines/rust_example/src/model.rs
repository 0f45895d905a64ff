//! The model, written as candle's `llama.rs` is: `Llama::forward(tokens, index_pos, cache)` runs a
//! chunk of tokens at positions index_pos.. and appends their keys and values to whatever the
//! cache holds. Nothing here compares index_pos with the cache's length — that is the caller's
//! job (session.rs), exactly the contract the source document's port got wrong. The arithmetic is
//! ../../../shared/spec/llama-forward.md's; its step numbers are beside the code.

use std::fs;
use std::path::Path;

use crate::config::Config;
use crate::safetensors::SafeTensors;

struct LayerWeights {
    input_norm: Vec<f32>, // (hidden)
    wq: Vec<f32>,         // (heads * head_dim, hidden)
    wk: Vec<f32>,         // (kv_heads * head_dim, hidden)
    wv: Vec<f32>,         // (kv_heads * head_dim, hidden)
    wo: Vec<f32>,         // (hidden, heads * head_dim)
    post_norm: Vec<f32>,  // (hidden)
    gate: Vec<f32>,       // (inter, hidden)
    up: Vec<f32>,         // (inter, hidden)
    down: Vec<f32>,       // (hidden, inter)
}

pub struct Llama {
    pub config: Config,
    embed: Vec<f32>,           // (vocab, hidden)
    layers: Vec<LayerWeights>, // [layers]
    final_norm: Vec<f32>,      // (hidden)
    lm_head: Option<Vec<f32>>, // (vocab, hidden); None when tied to `embed`
    inv_freq: Vec<f64>,        // (head_dim / 2): 1 / rope_theta^(2i / head_dim)
}

/// candle's `Cache`: every layer's keys and values so far, post-RoPE, KV heads un-repeated.
/// Deep copies are explicit (`fork`), so their cost shows.
pub struct Cache {
    kv_dim: usize,
    keys: Vec<Vec<f32>>,   // [layers] (len, kv_heads * head_dim)
    values: Vec<Vec<f32>>, // [layers] (len, kv_heads * head_dim)
}

impl Cache {
    pub fn new(config: &Config) -> Cache {
        Cache {
            kv_dim: config.kv_heads * config.head_dim,
            keys: vec![Vec::new(); config.layers],
            values: vec![Vec::new(); config.layers],
        }
    }

    /// Positions held (layer 0's; every layer holds the same between calls).
    pub fn len(&self) -> usize {
        self.keys[0].len() / self.kv_dim
    }

    /// Forgets positions >= n.
    pub fn truncate(&mut self, n: usize) {
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            layer.truncate(n * self.kv_dim);
        }
    }

    pub fn fork(&self) -> Cache {
        Cache { kv_dim: self.kv_dim, keys: self.keys.clone(), values: self.values.clone() }
    }

    /// Layer `l`'s keys, (len, kv_heads * head_dim): for the crate's tests.
    #[cfg(test)]
    pub fn keys(&self, l: usize) -> &[f32] {
        &self.keys[l]
    }
}

impl Llama {
    /// Reads DIR/config.json and DIR/model.safetensors (float32).
    pub fn load(dir: &Path) -> Result<Llama, String> {
        let config_path = dir.join("config.json");
        let text = fs::read(&config_path)
            .map_err(|e| format!("cannot read {}: {}", config_path.display(), e))?;
        let config =
            Config::from_json(&text).map_err(|e| format!("{}: {}", config_path.display(), e))?;
        let st_path = dir.join("model.safetensors");
        let bytes =
            fs::read(&st_path).map_err(|e| format!("cannot read {}: {}", st_path.display(), e))?;
        let what = st_path.display().to_string();
        let st = SafeTensors::parse(bytes, &what)?;
        Llama::from_tensors(config, &st).map_err(|e| format!("{}: {}", what, e))
    }

    pub(crate) fn from_tensors(config: Config, st: &SafeTensors) -> Result<Llama, String> {
        let (h, inter) = (config.hidden as u64, config.inter as u64);
        let q = (config.heads * config.head_dim) as u64;
        let kv = (config.kv_heads * config.head_dim) as u64;
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let t = |part: &str, shape: &[u64]| {
                st.f32_tensor(&format!("model.layers.{}.{}.weight", l, part), shape)
            };
            layers.push(LayerWeights {
                input_norm: t("input_layernorm", &[h])?,
                wq: t("self_attn.q_proj", &[q, h])?,
                wk: t("self_attn.k_proj", &[kv, h])?,
                wv: t("self_attn.v_proj", &[kv, h])?,
                wo: t("self_attn.o_proj", &[h, q])?,
                post_norm: t("post_attention_layernorm", &[h])?,
                gate: t("mlp.gate_proj", &[inter, h])?,
                up: t("mlp.up_proj", &[inter, h])?,
                down: t("mlp.down_proj", &[h, inter])?,
            });
        }
        let vocab = config.vocab as u64;
        let lm_head = if config.tie_embeddings {
            None
        } else {
            Some(st.f32_tensor("lm_head.weight", &[vocab, h])?)
        };
        let half = config.head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| 1.0 / config.rope_theta.powf((2 * i) as f64 / config.head_dim as f64))
            .collect();
        Ok(Llama {
            embed: st.f32_tensor("model.embed_tokens.weight", &[vocab, h])?,
            final_norm: st.f32_tensor("model.norm.weight", &[h])?,
            layers,
            lm_head,
            inv_freq,
            config,
        })
    }

    /// candle's `Llama::forward`: runs `tokens` (s of them, each < vocab) at positions
    /// index_pos..index_pos+s-1, appends their keys and values to `cache`, and returns the logits
    /// of every row, (s, vocab). An error (the shapes do not fit) leaves the cache as it was.
    pub fn forward(
        &self,
        tokens: &[u32],
        index_pos: usize,
        cache: &mut Cache,
    ) -> Result<Vec<f32>, String> {
        let before = cache.len();
        let result = self.forward_layers(tokens, index_pos, cache);
        if result.is_err() {
            cache.truncate(before); // the layers before the failing one had appended already
        }
        result
    }

    fn forward_layers(
        &self,
        tokens: &[u32],
        index_pos: usize,
        cache: &mut Cache,
    ) -> Result<Vec<f32>, String> {
        let c = &self.config;
        if index_pos + tokens.len() > c.max_pos {
            // candle's cos/sin narrow fails the same way: the RoPE table has max_pos rows.
            return Err(format!(
                "narrow invalid args start + len > dim_len: [{}, {}], dim: 0, start: {}, len: {}",
                c.max_pos,
                c.head_dim / 2,
                index_pos,
                tokens.len()
            ));
        }
        let s = tokens.len();
        let mut x = Vec::with_capacity(s * c.hidden); // (s, hidden): the residual stream
        for &t in tokens {
            x.extend_from_slice(&self.embed[t as usize * c.hidden..(t as usize + 1) * c.hidden]);
            // 1.
        }
        for (l, w) in self.layers.iter().enumerate() {
            // 6. h = x + Attn(RMSNorm(x)); out = h + MLP(RMSNorm(h)).
            let xn = rmsnorm(&x, &w.input_norm, c.rms_eps as f32);
            let attn = self.attention(w, &xn, index_pos, cache, l)?;
            add_in_place(&mut x, &attn);
            let xn = rmsnorm(&x, &w.post_norm, c.rms_eps as f32);
            add_in_place(&mut x, &self.mlp(w, &xn));
        }
        let xn = rmsnorm(&x, &self.final_norm, c.rms_eps as f32); // 7.
        Ok(matmul(&xn, self.lm_head.as_ref().unwrap_or(&self.embed), c.vocab, c.hidden))
    }

    /// A context shift on `cache` (keep + discard <= its length): positions [keep, keep + discard)
    /// are forgotten and the later ones move down by `discard`. Each moved key was cached rotated
    /// for its old position p; RoPE is a rotation, R(p - discard) = R(-discard)·R(p), so it is
    /// rotated by -discard in f32 on the cached values, as an engine with an f32 cache does it
    /// (the angles in f64, as in `rope`). Values move unchanged. `rerotate` false is the test-only
    /// bug=shift-not-rerotated: the keys keep their old positions' rotation.
    pub fn shift(&self, cache: &mut Cache, keep: usize, discard: usize, rerotate: bool) {
        let (kv_dim, d) = (cache.kv_dim, self.config.head_dim);
        for (keys, values) in cache.keys.iter_mut().zip(cache.values.iter_mut()) {
            keys.drain(keep * kv_dim..(keep + discard) * kv_dim); // (len - discard, kv_dim)
            values.drain(keep * kv_dim..(keep + discard) * kv_dim);
            if !rerotate || discard == 0 {
                continue; // bug=shift-not-rerotated: THE BUG (test-only)
            }
            for row in keys[keep * kv_dim..].chunks_exact_mut(kv_dim) {
                rope(row, d, -(discard as i64), &self.inv_freq);
            }
        }
    }

    /// Attention (4.) of s rows at positions index_pos.. over the layer's cache plus themselves.
    fn attention(
        &self,
        w: &LayerWeights,
        xn: &[f32],
        index_pos: usize,
        cache: &mut Cache,
        l: usize,
    ) -> Result<Vec<f32>, String> {
        let c = &self.config;
        let (d, s) = (c.head_dim, xn.len() / c.hidden);
        let kv_dim = c.kv_heads * d;
        let mut q = matmul(xn, &w.wq, c.heads * d, c.hidden); // (s, heads * d)
        let mut k = matmul(xn, &w.wk, kv_dim, c.hidden); // (s, kv_heads * d)
        let v = matmul(xn, &w.wv, kv_dim, c.hidden); // (s, kv_heads * d)
        for i in 0..s {
            let pos = (index_pos + i) as i64;
            rope(&mut q[i * c.heads * d..(i + 1) * c.heads * d], d, pos, &self.inv_freq);
            rope(&mut k[i * kv_dim..(i + 1) * kv_dim], d, pos, &self.inv_freq);
        }
        // The cache appends whatever it is given, as candle's does.
        cache.keys[l].extend_from_slice(&k);
        cache.values[l].extend_from_slice(&v);
        // Keys: the cached ones, then these s.
        let total = cache.keys[l].len() / kv_dim;
        // candle builds the causal mask (s, index_pos + s) only for s > 1 and broadcasts it to
        // the scores' shape (1, heads, s, total): it fits only when index_pos is the cache's
        // length. With one row there is no mask, and the row reads every cached key.
        if s > 1 && index_pos + s != total {
            return Err(format!(
                "cannot broadcast [{}, {}] to [1, {}, {}, {}]",
                s,
                index_pos + s,
                c.heads,
                s,
                total
            ));
        }
        let first_key = total - s; // row i is at cache row first_key + i and sees keys 0..=that
        let out = self.attend(&q, &cache.keys[l], &cache.values[l], s, first_key);
        Ok(matmul(&out, &w.wo, c.hidden, c.heads * d))
    }

    /// softmax(q.K^T / sqrt(d)) V per head, row i reading keys 0..=first_key+i; (s, heads * d).
    fn attend(
        &self,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        s: usize,
        first_key: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let (d, kv_dim, n_rep) = (c.head_dim, c.kv_heads * c.head_dim, c.heads / c.kv_heads);
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0.0f32; s * c.heads * d];
        let mut scores = vec![0.0f32; first_key + s];
        for i in 0..s {
            let visible = first_key + i + 1; // causal: key j hidden iff j > P + i
            for h in 0..c.heads {
                let qh = &q[(i * c.heads + h) * d..(i * c.heads + h + 1) * d];
                let kvh = h / n_rep; // query head h reads KV head h / n_rep
                let mut max = f32::NEG_INFINITY;
                for (t, score) in scores[..visible].iter_mut().enumerate() {
                    let kt = &keys[t * kv_dim + kvh * d..t * kv_dim + (kvh + 1) * d];
                    *score = dot(qh, kt) * scale;
                    max = max.max(*score);
                }
                let mut sum = 0.0f32;
                for score in scores[..visible].iter_mut() {
                    *score = (*score - max).exp();
                    sum += *score;
                }
                let oh = &mut out[(i * c.heads + h) * d..(i * c.heads + h + 1) * d];
                for (t, score) in scores[..visible].iter().enumerate() {
                    let p = score / sum;
                    let vt = &values[t * kv_dim + kvh * d..t * kv_dim + (kvh + 1) * d];
                    for (o, v) in oh.iter_mut().zip(vt) {
                        *o += p * v;
                    }
                }
            }
        }
        out
    }

    /// SwiGLU (5.): down(silu(gate(x)) * up(x)), rows (s, hidden).
    fn mlp(&self, w: &LayerWeights, xn: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let mut gate = matmul(xn, &w.gate, c.inter, c.hidden); // (s, inter)
        let up = matmul(xn, &w.up, c.inter, c.hidden); // (s, inter)
        for (g, u) in gate.iter_mut().zip(up.iter()) {
            *g = *g / (1.0 + (-*g).exp()) * u; // silu(g) * up
        }
        matmul(&gate, &w.down, c.hidden, c.inter)
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |sum, (x, y)| sum + x * y)
}

/// x (rows, cols) . W^T for W (out, cols): (rows, out).
fn matmul(x: &[f32], w: &[f32], out: usize, cols: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len() / cols * out);
    for row in x.chunks_exact(cols) {
        y.extend(w.chunks_exact(cols).take(out).map(|wr| dot(row, wr)));
    }
    y
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// RMSNorm (2.) of each row: x * rsqrt(mean(x^2) + eps) * weight. The squares are summed in f64:
/// in f32 the sum overflows for rows kvdiff's demanding models build (see the C example).
fn rmsnorm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let n = weight.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let inv_rms = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
        out.extend(row.iter().zip(weight).map(|(&v, &w)| (v * inv_rms) * w));
    }
    out
}

/// RoPE (3.), rotate-half layout (dimension i pairs with i + d/2), on every head of one row at
/// position `pos`. Angles in f64, so position 500 is as exact as position 5. A negative position
/// is a rotation back: a context shift rotates a cached key by -discard (Llama::shift).
fn rope(row: &mut [f32], d: usize, pos: i64, inv_freq: &[f64]) {
    let half = d / 2;
    for (i, f) in inv_freq.iter().enumerate() {
        let angle = pos as f64 * f;
        let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
        for head in row.chunks_exact_mut(d) {
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * cos - x2 * sin;
            head[i + half] = x2 * cos + x1 * sin;
        }
    }
}
