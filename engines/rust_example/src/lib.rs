//! A kvdiff engine in Rust: the source document's candle port, in its own language.
//!
//! The layers, bottom to top:
//! - `json`, `safetensors`, `config`: read a HuggingFace Llama directory by hand (no crates);
//! - `model`: the weights and a raw `forward(tokens, index_pos, cache)` like candle's
//!   `Llama::forward`: the caller passes the position, nothing compares it with the cache;
//! - `session`: the checked session over it (it owns its position and its cache), and the
//!   options' two bugs (`bug=pos0`, `bug=reuse`) that make it the document's caller instead;
//! - `ffi`: the C ABI of include/kvdiff/engine.h, every entry point behind catch_unwind.

mod config;
mod ffi;
mod json;
mod model;
mod options;
mod safetensors;
mod session;
#[cfg(test)]
mod tests;

pub use ffi::kvdiff_engine_entry;
