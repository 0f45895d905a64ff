#!/usr/bin/env python3
"""A Llama engine in numpy, for kvdiff to test: the arithmetic of transformers'
LlamaForCausalLM (eager attention; the "spec, N" notes number its steps) in float32, a KV cache per session, the position owned by the
session, and a context shift (its moved keys re-rotated in float32). It reads config.json and
model.safetensors itself.

    kvdiff conform exec:"/usr/bin/python3 examples/numpy_engine.py"
    kvdiff check --cases 200 --backends 'impl,exec:/usr/bin/python3 examples/numpy_engine.py'

Options (in the open call; `exec:COMMAND?key=value&...` on kvdiff's command line):
    bug=forgot-position   the session's position is never advanced: every append rotates its
                          queries and keys as if it started at position 0 (the seed's first bug)
    bug=none              the default
"""

import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kvdiff_engine  # noqa: E402
from kvdiff_engine import InputError  # noqa: E402

np = kvdiff_engine.numpy_or_refuse()

BUGS = ("none", "forgot-position")


# ---- The model files ----

def load_safetensors(path):
    """{name: float32 array}; F32, F16 and BF16 on disk."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise InputError("{}: {} bytes, too short for a safetensors file".format(path, len(data)))
    (header_size,) = struct.unpack_from("<Q", data, 0)
    if header_size > len(data) - 8:
        raise InputError("{}: a header of {} bytes in a file of {}".format(
            path, header_size, len(data)))
    header = json.loads(data[8:8 + header_size])
    base = 8 + header_size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[base + begin:base + end]
        dtype = entry["dtype"]
        if dtype == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":  # the high half of a float32
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise InputError("{}: tensor {} has dtype {} (expected F32, F16 or BF16)".format(
                path, name, dtype))
        tensors[name] = values.astype(np.float32).reshape(entry["shape"])
    return tensors


class Config:
    def __init__(self, c):
        self.hidden = c["hidden_size"]
        self.intermediate = c["intermediate_size"]
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.vocab = c["vocab_size"]
        self.max_positions = c["max_position_embeddings"]
        self.rope_theta = c.get("rope_theta", 10000.0)
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.rope_scaling = c.get("rope_scaling")
        if c.get("sliding_window") is not None:
            raise InputError("config.json: sliding_window {}: this engine has no sliding window"
                             .format(c["sliding_window"]))


def rope_inv_freq(cfg):
    """inv_freq[i] = 1 / theta^(2i/d), in float64; llama3 rope_scaling rescales it (spec, 3)."""
    d = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = cfg.rope_scaling
    if rs is None or rs.get("rope_type", rs.get("type")) == "default":
        return inv_freq
    if rs.get("rope_type", rs.get("type")) != "llama3":
        raise InputError("config.json: rope_scaling {} (this engine knows llama3)".format(rs))
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    orig = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - low) / (high - low)
    scaled = np.where(wavelen > orig / low, inv_freq / factor,
                      (1 - smooth) * inv_freq / factor + smooth * inv_freq)
    return np.where(wavelen < orig / high, inv_freq, scaled)


# ---- The forward pass: one function per block, in the spec's order ----

def rms_norm(x, w, eps):
    """x · rsqrt(mean(x²) + eps) · w (spec, 2). The mean of squares in float64, as kvdiff's impl
    does: in float32 it overflows for hidden states of ~1e19 (kvdiff's demanding models)."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)) * w


def rotate(x, cos, sin):
    """x · cos + rotate_half(x) · sin, "rotate half" layout (spec, 3). x: (heads, s, d)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def attention(h, layer, cfg, cos, sin, k_cache, v_cache):
    """Spec, 4. h: (s, hidden); cos, sin: (s, d) at the chunk's positions; the cache holds P
    positions: (kv_heads, P, d). Returns the output (s, hidden) and the cache with this chunk's
    keys and values appended."""
    s, d = h.shape[0], cfg.head_dim
    q = (h @ layer["q"].T).reshape(s, cfg.heads, d).transpose(1, 0, 2)  # (heads, s, d)
    k = (h @ layer["k"].T).reshape(s, cfg.kv_heads, d).transpose(1, 0, 2)  # (kv_heads, s, d)
    v = (h @ layer["v"].T).reshape(s, cfg.kv_heads, d).transpose(1, 0, 2)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    keys = np.concatenate([k_cache, k], axis=1)  # (kv_heads, P+s, d)
    values = np.concatenate([v_cache, v], axis=1)
    rep = cfg.heads // cfg.kv_heads  # query head i reads kv head i // rep
    scores = q @ np.repeat(keys, rep, axis=0).transpose(0, 2, 1) / np.float32(math.sqrt(d))
    past = k_cache.shape[1]
    hidden = np.arange(past + s)[None, :] > past + np.arange(s)[:, None]  # (s, P+s) causal mask
    scores = np.where(hidden, np.float32(-np.inf), scores)  # (heads, s, P+s)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = (probs @ np.repeat(values, rep, axis=0)).transpose(1, 0, 2).reshape(s, cfg.heads * d)
    return out @ layer["o"].T, keys, values


def mlp(x, layer):
    """down(silu(gate(x)) * up(x)) (spec, 5)."""
    gate = x @ layer["gate"].T
    return ((gate / (1 + np.exp(-gate))) * (x @ layer["up"].T)) @ layer["down"].T


class Model:
    def __init__(self, model_dir):
        try:
            with open(os.path.join(model_dir, "config.json")) as f:
                self.cfg = Config(json.load(f))
            w = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        except (OSError, ValueError, KeyError) as e:
            raise InputError("{}: cannot read the model: {}: {}".format(
                model_dir, type(e).__name__, e))
        cfg = self.cfg
        self.embed = w["model.embed_tokens.weight"]  # (vocab, hidden)
        self.norm = w["model.norm.weight"]
        self.lm_head = self.embed if cfg.tied else w["lm_head.weight"]  # (vocab, hidden)
        self.layers = []
        for i in range(cfg.layers):
            p = "model.layers.{}.".format(i)
            self.layers.append({
                "attn_norm": w[p + "input_layernorm.weight"],
                "mlp_norm": w[p + "post_attention_layernorm.weight"],
                "q": w[p + "self_attn.q_proj.weight"], "k": w[p + "self_attn.k_proj.weight"],
                "v": w[p + "self_attn.v_proj.weight"], "o": w[p + "self_attn.o_proj.weight"],
                "gate": w[p + "mlp.gate_proj.weight"], "up": w[p + "mlp.up_proj.weight"],
                "down": w[p + "mlp.down_proj.weight"]})
        self.inv_freq = rope_inv_freq(cfg)

    def rope(self, positions):
        """cos and sin (s, d) of the angles p · inv_freq[j mod d/2], computed in float64."""
        angles = np.asarray(positions, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        angles = np.concatenate([angles, angles], axis=-1)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def forward(self, tokens, positions, kv):
        """Spec, 6-7: logits (s, vocab) of `tokens` at `positions` after the cached `kv` (per
        layer, keys and values (kv_heads, P, d)); and the new kv. Changes nothing."""
        x = self.embed[tokens]  # (s, hidden)
        cos, sin = self.rope(positions)  # (s, d)
        new_kv = []
        for layer, (k_cache, v_cache) in zip(self.layers, kv):
            a, keys, values = attention(rms_norm(x, layer["attn_norm"], self.cfg.eps), layer,
                                        self.cfg, cos, sin, k_cache, v_cache)
            x = x + a
            x = x + mlp(rms_norm(x, layer["mlp_norm"], self.cfg.eps), layer)
            new_kv.append((keys, values))
        return rms_norm(x, self.norm, self.cfg.eps) @ self.lm_head.T, new_kv


# ---- The engine: sessions over the model ----

class Session:
    def __init__(self, model):
        cfg = model.cfg
        empty = np.zeros((cfg.kv_heads, 0, cfg.head_dim), dtype=np.float32)
        self.kv = [(empty, empty) for _ in range(cfg.layers)]
        self.position = 0  # the next token's position: the session owns it

    def length(self):
        return self.kv[0][0].shape[1]


class NumpyEngine(kvdiff_engine.Engine):
    name = "numpy-llama"
    version = "1"

    def open(self, model_dir, options):
        self.bug = options.pop("bug", "none")
        if self.bug not in BUGS:
            raise InputError("option bug={}: expected {}".format(self.bug, " or ".join(BUGS)))
        if options:
            raise InputError("unknown option '{}' (the numpy engine knows: bug)".format(
                next(iter(options))))
        self.model = Model(model_dir)

    def info(self):
        return kvdiff_engine.Info(vocab_size=self.model.cfg.vocab,
                                  max_length=self.model.cfg.max_positions)

    def session_new(self):
        return Session(self.model)

    def check(self, session, tokens, where=""):
        """InputError unless `tokens` may be appended to `session`: nothing has changed yet."""
        vocab, cap = self.model.cfg.vocab, self.model.cfg.max_positions
        bad = np.nonzero((tokens < 0) | (tokens >= vocab))[0]
        if len(bad):
            raise InputError("{}token id {} at index {} is out of range for vocab_size {}".format(
                where, tokens[bad[0]], bad[0], vocab))
        if session.length() + len(tokens) > cap:
            raise InputError("{}session holds {} positions of max_length {}: {} more tokens do "
                             "not fit".format(where, session.length(), cap, len(tokens)))

    def advance(self, session, tokens):
        """The logits of `tokens` after `session`'s history and the session's next state."""
        positions = np.arange(session.position, session.position + len(tokens))
        logits, kv = self.model.forward(tokens, positions, session.kv)
        advanced = 0 if self.bug == "forgot-position" else len(tokens)
        return logits, (kv, session.position + advanced)

    def append(self, session, tokens):
        self.check(session, tokens)
        logits, (session.kv, session.position) = self.advance(session, tokens)
        return logits

    def append_batch(self, items):
        # Every item checked, then every item run, then every session changed: a refused or
        # failing batch changes nothing (engine.h).
        for i, (session, tokens, _) in enumerate(items):
            self.check(session, tokens, "batch item {}: ".format(i))
        results = [self.advance(session, tokens) for session, tokens, _ in items]
        for (session, _, _), (_, state) in zip(items, results):
            session.kv, session.position = state
        return [logits[flags] for (_, _, flags), (logits, _) in zip(items, results)]

    def length(self, session):
        return session.length()

    def truncate(self, session, length):
        if not 0 <= length <= session.length():
            raise InputError("truncate to {}: expected 0 to the length {}".format(
                length, session.length()))
        session.kv = [(k[:, :length], v[:, :length]) for k, v in session.kv]
        session.position = length

    def shift(self, session, keep, discard):
        # The adapter has checked 0 <= keep, keep + discard <= length, discard > 0. Each moved key
        # was cached rotated for its old position p; R(p - discard) = R(-discard)·R(p).
        cos, sin = self.model.rope([-discard])  # (1, d)
        session.kv = [(np.concatenate([k[:, :keep], rotate(k[:, keep + discard:], cos, sin)], 1),
                       np.concatenate([v[:, :keep], v[:, keep + discard:]], 1))
                      for k, v in session.kv]
        if self.bug != "forgot-position":  # that bug's position never moves
            session.position -= discard

    def fork(self, session):
        child = Session(self.model)
        child.kv = [(k.copy(), v.copy()) for k, v in session.kv]
        child.position = session.position
        return child

    def reset(self, session):
        session.__init__(self.model)


if __name__ == "__main__":
    sys.exit(NumpyEngine().run())
