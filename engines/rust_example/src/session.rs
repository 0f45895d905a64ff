//! The checked session over the raw forward: what the source document's fixes (`ok`, `fresh`)
//! are, as an API. A session owns its position and its cache, so no caller can pass a wrong
//! index_pos or carry a cache into a new conversation. The options' bugs turn it back into the
//! document's caller: `pos0` passes index_pos 0 every time, `reuse` shares one cache among every
//! conversation and session, its index_pos restarting at 0.
//!
//! A call that fails changes nothing: inputs are checked before anything runs, and the forward
//! rolls its cache back when it fails.

use crate::model::{Cache, Llama};
use crate::options::{Bug, Options};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Status {
    /// The caller's fault (include/kvdiff/engine.h: KVDIFF_INVALID_INPUT).
    InvalidInput,
    /// The engine's (KVDIFF_ENGINE_FAILURE): here, the raw forward refusing what a bug passed it.
    EngineFailure,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub status: Status,
    pub message: String,
}

fn invalid(message: String) -> Failure {
    Failure { status: Status::InvalidInput, message }
}

pub struct Engine {
    pub model: Llama,
    pub options: Options,
    /// bug=reuse: the one cache every session appends to, never cleared (candle's llama.rs
    /// cannot clear one).
    shared: Cache,
}

pub struct Session {
    /// The next position: what a candle caller accumulates and passes as index_pos.
    position: usize,
    /// This conversation's cache (under bug=reuse the engine's shared one is used instead).
    cache: Cache,
}

/// One item of a batched call: a session, its tokens, and which rows' logits are wanted.
pub struct BatchItem<'a> {
    pub session: &'a mut Session,
    pub tokens: &'a [i32],
    pub output: Option<&'a [u8]>,
}

impl Engine {
    pub fn new(model: Llama, options: Options) -> Engine {
        let shared = Cache::new(&model.config);
        Engine { model, options, shared }
    }

    pub fn new_session(&self) -> Session {
        Session { position: 0, cache: Cache::new(&self.model.config) }
    }

    /// Runs every item, one after another (an example shows the contract, not batching speed),
    /// and returns the flagged rows' logits in item order. Checked first; if an item's forward
    /// fails, the items before it are rolled back, last first, so the call fails as a whole.
    pub fn append_batch(&mut self, items: &mut [BatchItem]) -> Result<Vec<f32>, Failure> {
        for (i, item) in items.iter().enumerate() {
            item.session
                .check_tokens(self, item.tokens)
                .map_err(|m| invalid(format!("batch item {}: {}", i, m)))?;
        }
        let mut logits = Vec::new();
        let mut before: Vec<(usize, usize)> = Vec::new(); // (position, cache length) of each item
        for i in 0..items.len() {
            let session = &mut *items[i].session;
            before.push((session.position, session.cache_of(self).len()));
            match session.run(self, items[i].tokens) {
                Ok(rows) => logits.extend(flagged(&rows, items[i].output, self.model.config.vocab)),
                Err(message) => {
                    for j in (0..i).rev() {
                        let (position, len) = before[j];
                        items[j].session.position = position;
                        items[j].session.cache_of_mut(self).truncate(len);
                    }
                    let message = format!("batch item {}: {}", i, message);
                    return Err(Failure { status: Status::EngineFailure, message });
                }
            }
        }
        Ok(logits)
    }
}

/// The rows of `rows` (n, vocab) that `output` flags (every row when None).
fn flagged(rows: &[f32], output: Option<&[u8]>, vocab: usize) -> Vec<f32> {
    match output {
        None => rows.to_vec(),
        Some(flags) => rows
            .chunks_exact(vocab)
            .zip(flags)
            .filter(|(_, f)| **f != 0)
            .flat_map(|(row, _)| row.iter().copied())
            .collect(),
    }
}

impl Session {
    pub fn length(&self) -> usize {
        self.position
    }

    /// Runs `tokens` at the session's next positions; their logits, (n, vocab).
    pub fn append(&mut self, engine: &mut Engine, tokens: &[i32]) -> Result<Vec<f32>, Failure> {
        self.check_tokens(engine, tokens).map_err(invalid)?;
        self.run(engine, tokens)
            .map_err(|message| Failure { status: Status::EngineFailure, message })
    }

    /// Forgets positions >= n.
    pub fn truncate(&mut self, engine: &mut Engine, n: i64) -> Result<(), Failure> {
        if n < 0 || n as u64 > self.position as u64 {
            return Err(invalid(format!(
                "truncate to {}: expected 0 <= length <= {} (the session's length)",
                n, self.position
            )));
        }
        self.position = n as usize;
        self.cache_of_mut(engine).truncate(n as usize);
        Ok(())
    }

    /// A context shift (engine.h ABI 3): forgets positions [keep, keep + discard) and moves the
    /// later ones down, their keys re-rotated (Llama::shift). Refused, changing nothing, unless
    /// 0 <= keep, 0 <= discard and keep + discard <= length (compared without adding: either may
    /// be i64::MAX).
    pub fn shift(&mut self, engine: &mut Engine, keep: i64, discard: i64) -> Result<(), Failure> {
        let length = self.position as i64;
        if keep < 0 || discard < 0 || keep > length || discard > length - keep {
            return Err(invalid(format!(
                "shift(keep={}, discard={}): expected 0 <= keep, 0 <= discard and keep + discard \
                 <= {} (the session's length)",
                keep, discard, length
            )));
        }
        let (keep, discard) = (keep as usize, discard as usize);
        let rerotate = engine.options.bug != Bug::ShiftNotRerotated;
        let cache =
            if engine.options.bug == Bug::Reuse { &mut engine.shared } else { &mut self.cache };
        if keep + discard > cache.len() {
            // bug=reuse only: another session truncated the shared cache below this one's length.
            return Err(Failure {
                status: Status::EngineFailure,
                message: format!(
                    "shift(keep={}, discard={}): the shared cache holds only {} positions",
                    keep,
                    discard,
                    cache.len()
                ),
            });
        }
        engine.model.shift(cache, keep, discard, rerotate);
        self.position -= discard;
        Ok(())
    }

    /// An explicit deep copy: the child's cache evolves apart from this one's.
    pub fn fork(&self) -> Session {
        Session { position: self.position, cache: self.cache.fork() }
    }

    /// A new conversation: position 0 and, for the checked session, a new cache. Under
    /// bug=reuse the shared cache keeps the previous conversation, as in the document.
    pub fn reset(&mut self, engine: &Engine) {
        self.position = 0;
        self.cache = Cache::new(&engine.model.config);
    }

    /// At least one token, every id in the vocab, room left: the message says which failed.
    fn check_tokens(&self, engine: &Engine, tokens: &[i32]) -> Result<(), String> {
        let vocab = engine.model.config.vocab;
        if tokens.is_empty() {
            return Err("tokens is empty (expected at least one token)".to_string());
        }
        if let Some((i, t)) =
            tokens.iter().enumerate().find(|(_, t)| **t < 0 || **t as usize >= vocab)
        {
            return Err(format!(
                "token id {} at index {} is out of range for vocab_size {}",
                t, i, vocab
            ));
        }
        let max_length = engine.options.max_length;
        if self.position + tokens.len() > max_length {
            return Err(format!(
                "session holds {} positions of max_length {}: {} more tokens do not fit",
                self.position,
                max_length,
                tokens.len()
            ));
        }
        Ok(())
    }

    /// The forward over checked tokens: here is where each bug passes the wrong thing.
    fn run(&mut self, engine: &mut Engine, tokens: &[i32]) -> Result<Vec<f32>, String> {
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let index_pos = match engine.options.bug {
            Bug::Pos0 => 0, // forgets its position: the document's `pos0`
            Bug::None | Bug::Reuse | Bug::ShiftNotRerotated => self.position,
        };
        let bug = engine.options.bug;
        let cache = if bug == Bug::Reuse { &mut engine.shared } else { &mut self.cache };
        let logits = engine.model.forward(&ids, index_pos, cache)?;
        self.position += tokens.len();
        Ok(logits)
    }

    #[cfg(test)]
    pub fn cache_for_tests(&self) -> &Cache {
        &self.cache
    }

    fn cache_of<'a>(&'a self, engine: &'a Engine) -> &'a Cache {
        if engine.options.bug == Bug::Reuse {
            &engine.shared
        } else {
            &self.cache
        }
    }

    fn cache_of_mut<'a>(&'a mut self, engine: &'a mut Engine) -> &'a mut Cache {
        if engine.options.bug == Bug::Reuse {
            &mut engine.shared
        } else {
            &mut self.cache
        }
    }
}
