//! The source document's own check, inside the crate: tokens fed one at a time through the
//! checked session and all at once without a cache give the same logits within 1e-4; and each
//! bug gives the document's symptom. The model is random and built in memory (no files).

use crate::config::Config;
use crate::model::{Cache, Llama};
use crate::options::{Bug, Options};
use crate::safetensors::SafeTensors;
use crate::session::{Engine, Failure, Status};

/// SmolLM2-135M's head layout (9 query heads, 3 KV heads) at a toy width (head_dim 2).
const CONFIG: &str = r#"{"hidden_size": 18, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 32,
    "max_position_embeddings": 64, "tie_word_embeddings": false}"#;

/// The tensors of CONFIG's Llama: (name, shape).
fn tensor_shapes() -> Vec<(String, Vec<u64>)> {
    let (h, inter, vocab, kv) = (18u64, 24u64, 32u64, 6u64);
    let mut shapes = vec![
        ("model.embed_tokens.weight".to_string(), vec![vocab, h]),
        ("model.norm.weight".to_string(), vec![h]),
        ("lm_head.weight".to_string(), vec![vocab, h]),
    ];
    for l in 0..2 {
        let parts = [
            ("input_layernorm", vec![h]),
            ("self_attn.q_proj", vec![h, h]),
            ("self_attn.k_proj", vec![kv, h]),
            ("self_attn.v_proj", vec![kv, h]),
            ("self_attn.o_proj", vec![h, h]),
            ("post_attention_layernorm", vec![h]),
            ("mlp.gate_proj", vec![inter, h]),
            ("mlp.up_proj", vec![inter, h]),
            ("mlp.down_proj", vec![h, inter]),
        ];
        for (part, shape) in parts.iter() {
            shapes.push((format!("model.layers.{}.{}.weight", l, part), shape.clone()));
        }
    }
    shapes
}

/// A safetensors file of random weights (norms near 1, matrices in [-0.4, 0.4)), parsed back.
fn random_llama(seed: u64) -> Llama {
    let mut state = seed;
    let mut header = String::from("{");
    let mut data: Vec<u8> = Vec::new();
    for (k, (name, shape)) in tensor_shapes().iter().enumerate() {
        let begin = data.len();
        for _ in 0..shape.iter().product::<u64>() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let w = if shape.len() == 1 { 0.9 + 0.2 * u } else { 0.8 * (u - 0.5) };
            data.extend_from_slice(&w.to_le_bytes());
        }
        let entry = format!(
            "\"{}\":{{\"dtype\":\"F32\",\"shape\":{:?},\"data_offsets\":[{},{}]}}",
            name,
            shape,
            begin,
            data.len()
        );
        header.push_str(if k > 0 { "," } else { "" });
        header.push_str(&entry);
    }
    header.push('}');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&data);
    let config = Config::from_json(CONFIG.as_bytes()).unwrap();
    Llama::from_tensors(config, &SafeTensors::parse(bytes, "random").unwrap()).unwrap()
}

fn engine(bug: Bug) -> Engine {
    Engine::new(random_llama(7), Options { bug, max_length: 64 })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The first conversation of the document: a 5-token prompt, then 19 decode steps.
const PROMPT: [i32; 5] = [5, 17, 3, 29, 12];
const DECODED: [i32; 19] = [1, 4, 9, 16, 25, 6, 19, 2, 21, 8, 27, 18, 11, 6, 3, 0, 31, 14, 7];

#[test]
fn cached_one_at_a_time_equals_uncached_all_at_once() {
    let mut e = engine(Bug::None);
    let mut session = e.new_session();
    let mut cached = session.append(&mut e, &PROMPT).unwrap();
    for t in DECODED.iter() {
        cached.extend(session.append(&mut e, &[*t]).unwrap());
    }
    let all: Vec<u32> = PROMPT.iter().chain(DECODED.iter()).map(|&t| t as u32).collect();
    let uncached = e.model.forward(&all, 0, &mut Cache::new(&e.model.config)).unwrap();
    let worst = max_abs_diff(&cached, &uncached);
    assert!(worst < 1e-4, "cached vs uncached: max |a-b| {}", worst);
}

#[test]
fn pos0_is_silent_and_wrong_from_the_first_decode_step() {
    let (mut good, mut bad) = (engine(Bug::None), engine(Bug::Pos0));
    let (mut g, mut b) = (good.new_session(), bad.new_session());
    let prompt =
        max_abs_diff(&g.append(&mut good, &PROMPT).unwrap(), &b.append(&mut bad, &PROMPT).unwrap());
    assert_eq!(prompt, 0.0, "the prompt runs at index_pos 0 either way");
    let step =
        max_abs_diff(&g.append(&mut good, &[1]).unwrap(), &b.append(&mut bad, &[1]).unwrap());
    assert!(step > 1e-3, "the decode step at index_pos 0 instead of 5 differs by only {}", step);
}

/// A first conversation of 24 positions on `e`'s session, and the cache it leaves.
fn first_conversation(e: &mut Engine) -> Cache {
    let mut first = e.new_session();
    first.append(e, &PROMPT).unwrap();
    for t in DECODED.iter() {
        first.append(e, &[*t]).unwrap();
    }
    let mut cache = Cache::new(&e.model.config);
    let all: Vec<u32> = PROMPT.iter().chain(DECODED.iter()).map(|&t| t as u32).collect();
    e.model.forward(&all, 0, &mut cache).unwrap();
    cache
}

#[test]
fn reuse_with_a_five_token_prompt_fails_with_the_documents_error() {
    let mut e = engine(Bug::Reuse);
    first_conversation(&mut e);
    let mut second = e.new_session();
    let err = second.append(&mut e, &[8, 17, 3, 20, 12]).unwrap_err();
    let want = "cannot broadcast [5, 5] to [1, 9, 5, 29]";
    assert_eq!(err, Failure { status: Status::EngineFailure, message: want.to_string() });
    assert_eq!(second.length(), 0, "a call that fails changes nothing");
}

#[test]
fn reuse_with_a_one_token_prompt_silently_continues_the_first_conversation() {
    let mut e = engine(Bug::Reuse);
    let mut old = first_conversation(&mut e);
    let mut second = e.new_session();
    let got = second.append(&mut e, &[8]).unwrap();
    // What the raw call gives on the first conversation's cache at index_pos 0, bit for bit ...
    let continued = e.model.forward(&[8], 0, &mut old).unwrap();
    assert_eq!(max_abs_diff(&got, &continued), 0.0);
    // ... and not what a new conversation gives.
    let fresh = e.model.forward(&[8], 0, &mut Cache::new(&e.model.config)).unwrap();
    assert!(max_abs_diff(&got, &fresh) > 1e-3);
}

/// A session of `e` fed the first `n` tokens of the document's conversation.
fn fed(e: &mut Engine, n: usize) -> crate::session::Session {
    let all: Vec<i32> = PROMPT.iter().chain(DECODED.iter()).copied().collect();
    let mut s = e.new_session();
    s.append(e, &all[..n]).unwrap();
    s
}

/// Layer 0's keys depend on their own token and position only, so after shift(keep, discard)
/// they must be what a forward of the remaining tokens computes at their new positions: the
/// re-rotation by -discard checked against a rotation made from scratch.
fn layer0_keys_after_shift(bug: Bug) -> f32 {
    let mut e = engine(bug);
    let mut s = fed(&mut e, 20);
    s.shift(&mut e, 3, 6).unwrap();
    assert_eq!(s.length(), 14);
    let all: Vec<u32> = PROMPT.iter().chain(DECODED.iter()).map(|&t| t as u32).collect();
    let rest: Vec<u32> = all[..3].iter().chain(all[9..20].iter()).copied().collect();
    let mut fresh = Cache::new(&e.model.config);
    e.model.forward(&rest, 0, &mut fresh).unwrap();
    max_abs_diff(s.cache_for_tests().keys(0), fresh.keys(0))
}

#[test]
fn a_shift_rerotates_the_moved_keys_to_their_new_positions() {
    let worst = layer0_keys_after_shift(Bug::None);
    assert!(worst < 1e-5, "layer 0 keys after a shift vs computed there: {}", worst);
    let bug = layer0_keys_after_shift(Bug::ShiftNotRerotated);
    assert!(bug > 1e-2, "bug=shift-not-rerotated moved keys differ by only {}", bug);
}

#[test]
fn two_shifts_are_one_shift_of_their_sum() {
    let mut e = engine(Bug::None);
    for keep in [0i64, 1, 4] {
        let (mut twice, mut once) = (fed(&mut e, 20), fed(&mut e, 20));
        twice.shift(&mut e, keep, 3).unwrap();
        twice.shift(&mut e, keep, 5).unwrap();
        once.shift(&mut e, keep, 8).unwrap();
        let next = [7, 20, 31];
        let worst = max_abs_diff(
            &twice.append(&mut e, &next).unwrap(),
            &once.append(&mut e, &next).unwrap(),
        );
        // f32 rounds each re-rotation once: R(-3)·R(-5) and R(-8) differ by their cos/sin's rounding.
        assert!(worst < 2e-5, "keep {}: two shifts vs one of their sum: {}", keep, worst);
    }
}

#[test]
fn a_bad_shift_is_refused_and_changes_nothing() {
    let mut e = engine(Bug::None);
    let (mut s, mut twin) = (fed(&mut e, 6), fed(&mut e, 6));
    for (keep, discard) in [(4, 3), (-1, 1), (1, -1), (7, 0), (1, i64::MAX), (i64::MAX, 1)] {
        let err = s.shift(&mut e, keep, discard).unwrap_err();
        assert_eq!(err.status, Status::InvalidInput);
        assert_eq!(s.length(), 6);
    }
    let err = s.shift(&mut e, 4, 3).unwrap_err().message;
    assert_eq!(
        err,
        "shift(keep=4, discard=3): expected 0 <= keep, 0 <= discard and keep + discard <= 6 \
         (the session's length)"
    );
    let next = [7, 20, 31];
    assert_eq!(
        max_abs_diff(&s.append(&mut e, &next).unwrap(), &twin.append(&mut e, &next).unwrap()),
        0.0
    );
}
