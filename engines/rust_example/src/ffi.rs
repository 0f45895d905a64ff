//! The C ABI of include/kvdiff/engine.h (version 3), declared by hand: no bindgen, no crates.
//! Every entry point runs its work inside catch_unwind, since a panic unwinding into C is
//! undefined behaviour: a panic becomes KVDIFF_ENGINE_FAILURE with the panic's text. (The two
//! error getters only return a pointer the handle holds: there is no work in them to guard.)

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;

use crate::model::Llama;
use crate::options::Options;
use crate::session::{BatchItem, Engine, Failure, Session, Status};

const ABI_VERSION: u32 = 3; // KVDIFF_ENGINE_ABI_VERSION

// kvdiff_status
type KvdiffStatus = i32;
const KVDIFF_OK: KvdiffStatus = 0;
const KVDIFF_INVALID_INPUT: KvdiffStatus = 1;
const KVDIFF_ENGINE_FAILURE: KvdiffStatus = 2;

/// kvdiff_engine: the opened model, or the reason it could not be opened.
pub struct EngineHandle {
    engine: Option<Engine>,
    /// Why open failed (kept apart from `error`, which every later failed call overwrites).
    open_failure: String,
    error: CString,
}

/// kvdiff_session.
pub struct SessionHandle {
    engine: *mut EngineHandle,
    session: Session,
    error: CString,
}

#[repr(C)]
pub struct KvdiffSize {
    name: *const c_char,
    value: i64,
}

#[repr(C)]
pub struct KvdiffEngineInfo {
    vocab_size: i64,
    max_length: i64,
    cache_dtype: *const c_char,
    sizes: *const KvdiffSize,
    num_sizes: usize,
    max_sessions: i64,     // ABI 2
    max_batch_tokens: i64, // ABI 2
}

#[repr(C)]
pub struct KvdiffBatchItem {
    session: *mut SessionHandle,
    tokens: *const i32,
    n: i64,
    output: *const u8,
}

#[repr(C)]
pub struct KvdiffEngineApi {
    abi_version: u32, // always first: the loader reads it before anything else
    name: *const c_char,
    version: *const c_char,
    open:
        unsafe extern "C" fn(*const c_char, *const c_char, *mut *mut EngineHandle) -> KvdiffStatus,
    engine_error: unsafe extern "C" fn(*const EngineHandle) -> *const c_char,
    engine_info: unsafe extern "C" fn(*mut EngineHandle, *mut KvdiffEngineInfo) -> KvdiffStatus,
    close: unsafe extern "C" fn(*mut EngineHandle),
    session_new: unsafe extern "C" fn(*mut EngineHandle, *mut *mut SessionHandle) -> KvdiffStatus,
    append:
        unsafe extern "C" fn(*mut SessionHandle, *const i32, i64, *mut f32, i64) -> KvdiffStatus,
    length: unsafe extern "C" fn(*const SessionHandle) -> i64,
    truncate: unsafe extern "C" fn(*mut SessionHandle, i64) -> KvdiffStatus,
    fork: unsafe extern "C" fn(*mut SessionHandle, *mut *mut SessionHandle) -> KvdiffStatus,
    reset: unsafe extern "C" fn(*mut SessionHandle) -> KvdiffStatus,
    session_error: unsafe extern "C" fn(*const SessionHandle) -> *const c_char,
    session_free: unsafe extern "C" fn(*mut SessionHandle),
    append_batch: unsafe extern "C" fn(
        *mut EngineHandle,
        *const KvdiffBatchItem,
        i64,
        *mut f32,
        i64,
    ) -> KvdiffStatus, // ABI 2
    shift: unsafe extern "C" fn(*mut SessionHandle, i64, i64) -> KvdiffStatus, // ABI 3
}

// The table holds pointers to static strings only; nothing in it is ever written.
unsafe impl Sync for KvdiffEngineApi {}

static API: KvdiffEngineApi = KvdiffEngineApi {
    abi_version: ABI_VERSION,
    name: b"rust_example\0".as_ptr() as *const c_char,
    version: b"1.0\0".as_ptr() as *const c_char,
    open: engine_open,
    engine_error,
    engine_info,
    close: engine_close,
    session_new,
    append,
    length,
    truncate,
    fork,
    reset,
    session_error,
    session_free,
    append_batch,
    shift,
};

/// The one exported symbol.
#[no_mangle]
pub extern "C" fn kvdiff_engine_entry() -> *const KvdiffEngineApi {
    &API
}

// ---- errors and panics ----

fn c_text(message: String) -> CString {
    // An interior NUL would truncate the C string; replace it rather than lose the message.
    CString::new(message.replace('\0', "\\0")).unwrap_or_default()
}

fn code(status: Status) -> KvdiffStatus {
    match status {
        Status::InvalidInput => KVDIFF_INVALID_INPUT,
        Status::EngineFailure => KVDIFF_ENGINE_FAILURE,
    }
}

fn invalid(message: String) -> Failure {
    Failure { status: Status::InvalidInput, message }
}

/// Runs `work`, catching a panic; stores the failure's message in `error`.
fn guarded<F: FnOnce() -> Result<(), Failure>>(error: *mut CString, work: F) -> KvdiffStatus {
    let outcome = catch_unwind(AssertUnwindSafe(work));
    let failure = match outcome {
        Ok(Ok(())) => return KVDIFF_OK,
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Failure {
                status: Status::EngineFailure,
                message: format!("internal error in the Rust engine (a panic): {}", what),
            }
        }
    };
    // SAFETY: `error` points into a live handle the caller passed us (checked non-null).
    unsafe { *error = c_text(failure.message) };
    code(failure.status)
}

fn opened(handle: &mut EngineHandle) -> Result<&mut Engine, Failure> {
    match handle.engine.as_mut() {
        Some(engine) => Ok(engine),
        None => Err(invalid(format!("the engine did not open: {}", handle.open_failure))),
    }
}

fn c_str_arg(p: *const c_char, what: &str) -> Result<String, Failure> {
    if p.is_null() {
        return Err(invalid(format!("{} is NULL", what)));
    }
    // SAFETY: the ABI passes NUL-terminated text.
    let text = unsafe { CStr::from_ptr(p) };
    text.to_str()
        .map(|s| s.to_string())
        .map_err(|_| invalid(format!("{} is not valid UTF-8", what)))
}

/// tokens[0..n] as a slice, refusing n < 1 as the checked session would, and a NULL pointer.
unsafe fn tokens_arg<'a>(tokens: *const i32, n: i64) -> Result<&'a [i32], Failure> {
    if n < 1 {
        return Err(invalid(format!(
            "tokens is empty (expected at least one token, got n = {})",
            n
        )));
    }
    if tokens.is_null() {
        return Err(invalid(format!("tokens is NULL with n = {}", n)));
    }
    Ok(std::slice::from_raw_parts(tokens, n as usize))
}

/// Refuses a logits buffer of `capacity` floats that cannot take rows x vocab (or is NULL), before
/// anything runs; `what` names the rows in the message.
unsafe fn check_capacity(
    out: *mut f32,
    capacity: i64,
    rows: usize,
    vocab: usize,
    what: &str,
) -> Result<(), Failure> {
    let need = (rows * vocab) as i64;
    if (need > 0 && out.is_null()) || capacity < need {
        return Err(invalid(format!(
            "logits buffer holds {} floats, {} {} x vocab {} need {}",
            capacity, rows, what, vocab, need
        )));
    }
    Ok(())
}

// ---- the engine ----

unsafe extern "C" fn engine_open(
    model_dir: *const c_char,
    options: *const c_char,
    out: *mut *mut EngineHandle,
) -> KvdiffStatus {
    if out.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    let handle = Box::into_raw(Box::new(EngineHandle {
        engine: None,
        open_failure: String::new(),
        error: CString::default(),
    }));
    *out = handle;
    let status = guarded(&mut (*handle).error, || {
        let dir = c_str_arg(model_dir, "model_dir")?;
        let option_text =
            if options.is_null() { String::new() } else { c_str_arg(options, "options")? };
        let model = Llama::load(Path::new(&dir)).map_err(invalid)?;
        let options = Options::parse(&option_text, model.config.max_pos).map_err(invalid)?;
        (*handle).engine = Some(Engine::new(model, options));
        Ok(())
    });
    if status != KVDIFF_OK {
        (*handle).open_failure = (*handle).error.to_string_lossy().into_owned();
    }
    status
}

unsafe extern "C" fn engine_error(e: *const EngineHandle) -> *const c_char {
    if e.is_null() {
        return b"engine is NULL\0".as_ptr() as *const c_char;
    }
    (*e).error.as_ptr()
}

unsafe extern "C" fn engine_info(e: *mut EngineHandle, out: *mut KvdiffEngineInfo) -> KvdiffStatus {
    if e.is_null() || out.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    guarded(&mut (*e).error, || {
        let engine = opened(&mut *e)?;
        *out = KvdiffEngineInfo {
            vocab_size: engine.model.config.vocab as i64,
            max_length: engine.options.max_length as i64,
            cache_dtype: b"f32\0".as_ptr() as *const c_char,
            sizes: ptr::null(), // whole chunks at once: no tiles, pages or thresholds
            num_sizes: 0,
            max_sessions: 0,
            max_batch_tokens: 0,
        };
        Ok(())
    })
}

unsafe extern "C" fn engine_close(e: *mut EngineHandle) {
    if !e.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(e))));
    }
}

// ---- sessions ----

unsafe extern "C" fn session_new(
    e: *mut EngineHandle,
    out: *mut *mut SessionHandle,
) -> KvdiffStatus {
    if e.is_null() || out.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    *out = ptr::null_mut();
    guarded(&mut (*e).error, || {
        let session = opened(&mut *e)?.new_session();
        *out = Box::into_raw(Box::new(SessionHandle {
            engine: e,
            session,
            error: CString::default(),
        }));
        Ok(())
    })
}

unsafe extern "C" fn append(
    s: *mut SessionHandle,
    tokens: *const i32,
    n: i64,
    logits: *mut f32,
    logits_capacity: i64,
) -> KvdiffStatus {
    if s.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    guarded(&mut (*s).error, || {
        let handle = &mut *s;
        let engine = opened(&mut *handle.engine)?;
        let tokens = tokens_arg(tokens, n)?;
        check_capacity(logits, logits_capacity, tokens.len(), engine.model.config.vocab, "tokens")?;
        let rows = handle.session.append(engine, tokens)?;
        ptr::copy_nonoverlapping(rows.as_ptr(), logits, rows.len());
        Ok(())
    })
}

/// -1 for a NULL session (the ABI has no status here); nothing in it can panic, but every entry
/// point is guarded alike, so no later change can let a panic reach C.
unsafe extern "C" fn length(s: *const SessionHandle) -> i64 {
    if s.is_null() {
        return -1;
    }
    catch_unwind(AssertUnwindSafe(|| (*s).session.length() as i64)).unwrap_or(-1)
}

unsafe extern "C" fn truncate(s: *mut SessionHandle, n: i64) -> KvdiffStatus {
    if s.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    guarded(&mut (*s).error, || {
        let handle = &mut *s;
        handle.session.truncate(opened(&mut *handle.engine)?, n)
    })
}

unsafe extern "C" fn shift(s: *mut SessionHandle, keep: i64, discard: i64) -> KvdiffStatus {
    if s.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    guarded(&mut (*s).error, || {
        let handle = &mut *s;
        handle.session.shift(opened(&mut *handle.engine)?, keep, discard)
    })
}

unsafe extern "C" fn fork(s: *mut SessionHandle, out: *mut *mut SessionHandle) -> KvdiffStatus {
    if s.is_null() || out.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    *out = ptr::null_mut();
    guarded(&mut (*s).error, || {
        let handle = &*s;
        let child = SessionHandle {
            engine: handle.engine,
            session: handle.session.fork(),
            error: CString::default(),
        };
        *out = Box::into_raw(Box::new(child));
        Ok(())
    })
}

unsafe extern "C" fn reset(s: *mut SessionHandle) -> KvdiffStatus {
    if s.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    guarded(&mut (*s).error, || {
        let handle = &mut *s;
        handle.session.reset(opened(&mut *handle.engine)?);
        Ok(())
    })
}

unsafe extern "C" fn session_error(s: *const SessionHandle) -> *const c_char {
    if s.is_null() {
        return b"session is NULL\0".as_ptr() as *const c_char;
    }
    (*s).error.as_ptr()
}

unsafe extern "C" fn session_free(s: *mut SessionHandle) {
    if !s.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(s))));
    }
}

// ---- the batched call (ABI 2) ----

unsafe extern "C" fn append_batch(
    e: *mut EngineHandle,
    items: *const KvdiffBatchItem,
    n_items: i64,
    logits: *mut f32,
    logits_capacity: i64,
) -> KvdiffStatus {
    if e.is_null() {
        return KVDIFF_INVALID_INPUT;
    }
    guarded(&mut (*e).error, || {
        if items.is_null() || n_items < 1 {
            return Err(invalid(format!("a batch of {} items (expected at least one)", n_items)));
        }
        let raw = std::slice::from_raw_parts(items, n_items as usize);
        let mut batch = batch_items(e, raw)?;
        let engine = opened(&mut *e)?;
        let vocab = engine.model.config.vocab;
        let rows: usize = batch
            .iter()
            .map(|item| match item.output {
                None => item.tokens.len(),
                Some(flags) => flags.iter().filter(|&&f| f != 0).count(),
            })
            .sum();
        check_capacity(logits, logits_capacity, rows, vocab, "flagged rows")?;
        let written = engine.append_batch(&mut batch)?;
        ptr::copy_nonoverlapping(written.as_ptr(), logits, written.len());
        Ok(())
    })
}

/// The C items as sessions of engine `e`, each named once (so the &mut borrows are distinct).
unsafe fn batch_items<'a>(
    e: *mut EngineHandle,
    raw: &'a [KvdiffBatchItem],
) -> Result<Vec<BatchItem<'a>>, Failure> {
    let mut batch = Vec::with_capacity(raw.len());
    for (i, item) in raw.iter().enumerate() {
        if item.session.is_null() || (*item.session).engine != e {
            return Err(invalid(format!("batch item {} is not a session of this engine", i)));
        }
        if let Some(j) = raw[..i].iter().position(|other| other.session == item.session) {
            return Err(invalid(format!("batch items {} and {} name the same session", j, i)));
        }
        let tokens = tokens_arg(item.tokens, item.n)
            .map_err(|f| invalid(format!("batch item {}: {}", i, f.message)))?;
        let output = if item.output.is_null() {
            None
        } else {
            Some(std::slice::from_raw_parts(item.output, tokens.len()))
        };
        batch.push(BatchItem { session: &mut (*item.session).session, tokens, output });
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_engine_failure_with_its_text() {
        let mut error = CString::default();
        let status = guarded(&mut error, || panic!("index 9 out of range for length 4"));
        assert_eq!(status, KVDIFF_ENGINE_FAILURE);
        assert_eq!(
            error.to_str().unwrap(),
            "internal error in the Rust engine (a panic): index 9 out of range for length 4"
        );
    }

    #[test]
    fn a_refusal_keeps_its_status_and_message() {
        let mut error = CString::default();
        let status = guarded(&mut error, || Err(invalid("truncate to 9: expected ...".into())));
        assert_eq!(
            (status, error.to_str().unwrap()),
            (KVDIFF_INVALID_INPUT, "truncate to 9: expected ...")
        );
    }
}
