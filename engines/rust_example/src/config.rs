//! config.json -> Config, as candle's `LlamaConfig` reads it, refusing what this plain Llama would
//! get wrong silently (rope_scaling, another activation) instead of ignoring it.

use crate::json::{self, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hidden: usize,        // hidden_size
    pub inter: usize,         // intermediate_size
    pub layers: usize,        // num_hidden_layers
    pub heads: usize,         // num_attention_heads
    pub kv_heads: usize,      // num_key_value_heads (default: heads)
    pub head_dim: usize,      // head_dim (default: hidden / heads)
    pub vocab: usize,         // vocab_size
    pub max_pos: usize,       // max_position_embeddings: the RoPE table's rows
    pub rope_theta: f64,      // rope_theta (10000)
    pub rms_eps: f64,         // rms_norm_eps (1e-6, transformers' default)
    pub tie_embeddings: bool, // tie_word_embeddings: lm_head is the embedding matrix
}

/// Sizes above this are refused: they would be a typo or an attack, not a model to run on a CPU.
const MAX_DIM: u64 = 1 << 24;

impl Config {
    pub fn from_json(text: &[u8]) -> Result<Config, String> {
        let root = json::parse(text).map_err(|e| e.to_string())?;
        if !matches!(root, Value::Object(_)) {
            return Err(format!("expected an object, got {}", root.kind()));
        }
        refuse_unsupported(&root)?;
        let heads = size(&root, "num_attention_heads")?;
        let hidden = size(&root, "hidden_size")?;
        let config = Config {
            hidden,
            inter: size(&root, "intermediate_size")?,
            layers: size(&root, "num_hidden_layers")?,
            heads,
            kv_heads: optional(&root, "num_key_value_heads", || Ok(heads))?,
            head_dim: optional(&root, "head_dim", || Ok(hidden / heads))?,
            vocab: size(&root, "vocab_size")?,
            max_pos: size(&root, "max_position_embeddings")?,
            rope_theta: float(&root, "rope_theta", 10000.0)?,
            rms_eps: float(&root, "rms_norm_eps", 1e-6)?,
            tie_embeddings: match root.get("tie_word_embeddings") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(format!(
                        "tie_word_embeddings is {}, expected true or false",
                        v.kind()
                    ))
                }
            },
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        if self.kv_heads == 0 || self.heads % self.kv_heads != 0 {
            return Err(format!(
                "num_key_value_heads {} must divide num_attention_heads {}",
                self.kv_heads, self.heads
            ));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim must be positive and even for RoPE, got {}",
                self.head_dim
            ));
        }
        if self.rope_theta <= 0.0 || self.rms_eps < 0.0 {
            // JSON has no NaN
            return Err(format!(
                "rope_theta {} must be > 0 and rms_norm_eps {} >= 0",
                self.rope_theta, self.rms_eps
            ));
        }
        Ok(())
    }
}

/// Keys whose non-default values change the arithmetic: refused, never ignored.
fn refuse_unsupported(root: &Value) -> Result<(), String> {
    match root.get("rope_scaling") {
        None | Some(Value::Null) => {}
        Some(_) => {
            return Err(
                "rope_scaling is not supported by the Rust example engine (only null)".into()
            )
        }
    }
    match root.get("hidden_act").map(|v| v.as_str()) {
        None | Some(Some("silu")) => {}
        Some(other) => {
            return Err(format!("hidden_act {:?} is not supported (only \"silu\")", other))
        }
    }
    for key in ["attention_bias", "mlp_bias"].iter() {
        if let Some(v) = root.get(key) {
            if *v != Value::Bool(false) {
                return Err(format!(
                    "{} must be false (this Llama has no biases), got {:?}",
                    key, v
                ));
            }
        }
    }
    Ok(())
}

fn size(root: &Value, key: &str) -> Result<usize, String> {
    match root.get(key) {
        None => Err(format!("{} is missing", key)),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_DIM).contains(&n) => Ok(n as usize),
            _ => Err(format!("{} is {:?}, expected an integer in [1, {}]", key, v, MAX_DIM)),
        },
    }
}

fn optional(
    root: &Value,
    key: &str,
    default: impl Fn() -> Result<usize, String>,
) -> Result<usize, String> {
    match root.get(key) {
        None | Some(Value::Null) => default(),
        Some(_) => size(root, key),
    }
}

fn float(root: &Value, key: &str, default: f64) -> Result<f64, String> {
    match root.get(key) {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| format!("{} is {}, expected a number", key, v.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "rope_scaling": null, "tie_word_embeddings": false}"#;

    #[test]
    fn reads_a_config_with_defaults() {
        let c = Config::from_json(TINY.as_bytes()).unwrap();
        assert_eq!((c.head_dim, c.kv_heads, c.rope_theta), (16, 2, 10000.0));
    }

    #[test]
    fn refuses_what_it_would_get_wrong() {
        let scaled =
            TINY.replace("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"llama3\"}");
        assert!(Config::from_json(scaled.as_bytes()).unwrap_err().contains("rope_scaling"));
        let odd = TINY.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        assert!(Config::from_json(odd.as_bytes()).unwrap_err().contains("must divide"));
        let missing = TINY.replace("\"vocab_size\": 256,", "");
        assert_eq!(Config::from_json(missing.as_bytes()).unwrap_err(), "vocab_size is missing");
    }
}
