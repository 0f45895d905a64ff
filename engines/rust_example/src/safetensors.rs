//! model.safetensors: an 8-byte little-endian header length N, N bytes of JSON naming every tensor
//! (`{"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, "__metadata__":
//! {...}}`), then the data. Everything is checked when the file is opened — header size, each
//! entry's fields, offsets inside the data and sized to dtype x shape — so reading a tensor later
//! cannot go out of bounds; anything unexpected is refused with the tensor's name.

use crate::json::{self, Value};

/// The format's own bound on the header (safetensors refuses larger ones too).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Byte range inside the data section (after the header).
    pub begin: usize,
    pub end: usize,
}

pub struct SafeTensors {
    bytes: Vec<u8>,
    data_start: usize,
    tensors: Vec<TensorInfo>,
}

/// Bytes per element of the dtypes the format defines; anything else is refused.
fn dtype_size(dtype: &str) -> Option<u64> {
    match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => Some(1),
        "U16" | "I16" | "F16" | "BF16" => Some(2),
        "U32" | "I32" | "F32" => Some(4),
        "U64" | "I64" | "F64" => Some(8),
        _ => None,
    }
}

impl SafeTensors {
    /// Checks the whole header of `bytes` (the file's contents); `what` names the file in errors.
    pub fn parse(bytes: Vec<u8>, what: &str) -> Result<SafeTensors, String> {
        if bytes.len() < 8 {
            return Err(format!(
                "{}: {} bytes, too short for the 8-byte header length",
                what,
                bytes.len()
            ));
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[..8]);
        let header_len = u64::from_le_bytes(len);
        let available = bytes.len() as u64 - 8;
        if header_len > available || header_len > MAX_HEADER_BYTES {
            return Err(format!(
                "{}: header length {} does not fit the file of {} bytes (at most {} after the \
                 length, and {} in all)",
                what,
                header_len,
                bytes.len(),
                available,
                MAX_HEADER_BYTES
            ));
        }
        let data_start = 8 + header_len as usize;
        let header =
            json::parse(&bytes[8..data_start]).map_err(|e| format!("{}: header: {}", what, e))?;
        let members = match header {
            Value::Object(members) => members,
            other => {
                return Err(format!("{}: header is {}, expected an object", what, other.kind()))
            }
        };
        let data_len = (bytes.len() - data_start) as u64;
        let mut tensors = Vec::new();
        for (name, entry) in members.iter() {
            if name == "__metadata__" {
                check_metadata(entry).map_err(|e| format!("{}: __metadata__ {}", what, e))?;
                continue;
            }
            let info = tensor_info(name, entry, data_len)
                .map_err(|e| format!("{}: tensor '{}': {}", what, name, e))?;
            tensors.push(info);
        }
        Ok(SafeTensors { bytes, data_start, tensors })
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The F32 tensor `name` of exactly `shape`, copied out (the file may not be 4-aligned).
    pub fn f32_tensor(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>, String> {
        let info = self.info(name).ok_or_else(|| format!("tensor '{}' is missing", name))?;
        if info.dtype != "F32" {
            return Err(format!(
                "tensor '{}' is {}; the Rust example engine reads F32 only (write the model with \
                 --dtype f32)",
                name, info.dtype
            ));
        }
        if info.shape != shape {
            return Err(format!(
                "tensor '{}' has shape {:?}, expected {:?}",
                name, info.shape, shape
            ));
        }
        let raw = &self.bytes[self.data_start + info.begin..self.data_start + info.end];
        Ok(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }
}

fn check_metadata(entry: &Value) -> Result<(), String> {
    match entry {
        Value::Object(members) => match members.iter().find(|(_, v)| v.as_str().is_none()) {
            Some((k, v)) => Err(format!("value of '{}' is {}, expected a string", k, v.kind())),
            None => Ok(()),
        },
        other => Err(format!("is {}, expected an object of strings", other.kind())),
    }
}

/// One tensor's entry, checked against the data section of `data_len` bytes.
fn tensor_info(name: &str, entry: &Value, data_len: u64) -> Result<TensorInfo, String> {
    let members = match entry {
        Value::Object(members) => members,
        other => return Err(format!("entry is {}, expected an object", other.kind())),
    };
    if let Some((key, _)) =
        members.iter().find(|(k, _)| !matches!(k.as_str(), "dtype" | "shape" | "data_offsets"))
    {
        return Err(format!("unknown field '{}' (expected dtype, shape, data_offsets)", key));
    }
    let dtype = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("dtype is missing or not a string")?
        .to_string();
    let size = dtype_size(&dtype).ok_or_else(|| format!("unknown dtype '{}'", dtype))?;
    let shape = u64_list(entry.get("shape"), "shape")?;
    let offsets = u64_list(entry.get("data_offsets"), "data_offsets")?;
    if offsets.len() != 2 || offsets[0] > offsets[1] || offsets[1] > data_len {
        return Err(format!(
            "data_offsets {:?} are not [begin, end] with begin <= end <= {} (the data's size)",
            offsets, data_len
        ));
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("shape {:?} overflows", shape))?;
    let want = elements.checked_mul(size).ok_or_else(|| format!("shape {:?} overflows", shape))?;
    if offsets[1] - offsets[0] != want {
        return Err(format!(
            "data_offsets {:?} hold {} bytes, but {} {:?} needs {}",
            offsets,
            offsets[1] - offsets[0],
            dtype,
            shape,
            want
        ));
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        begin: offsets[0] as usize,
        end: offsets[1] as usize,
    })
}

fn u64_list(value: Option<&Value>, what: &str) -> Result<Vec<u64>, String> {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64().ok_or_else(|| format!("{} holds {:?}, expected integers >= 0", what, v))
            })
            .collect(),
        Some(other) => Err(format!("{} is {}, expected an array", what, other.kind())),
        None => Err(format!("{} is missing", what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    #[test]
    fn reads_an_f32_tensor() {
        let data: Vec<u8> = [1.0f32, -2.0, 3.5].iter().flat_map(|f| f.to_le_bytes()).collect();
        let bytes = file(
            concat!(
                r#"{"__metadata__":{"format":"pt"},"#,
                r#""w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#
            ),
            &data,
        );
        let st = SafeTensors::parse(bytes, "m").unwrap();
        assert_eq!(st.f32_tensor("w", &[3]).unwrap(), vec![1.0, -2.0, 3.5]);
        assert!(st
            .f32_tensor("w", &[1, 3])
            .unwrap_err()
            .contains("has shape [3], expected [1, 3]"));
        assert!(st.f32_tensor("v", &[3]).unwrap_err().contains("tensor 'v' is missing"));
    }

    #[test]
    fn refuses_malformed_files() {
        let cases: [(Vec<u8>, &str); 7] = [
            (vec![1, 2, 3], "too short"),
            (file("{}", b"").into_iter().take(9).collect(), "does not fit the file"),
            (file("[1]", b""), "header is an array"),
            (
                file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, &[0; 8]),
                "hold 4 bytes",
            ),
            (file(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#, &[0; 4]), "<= 4"),
            (
                file(r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}"#, &[0; 4]),
                "unknown dtype 'Q4'",
            ),
            (file(r#"{"w":{"dtype":"F32","shape":[1]}}"#, &[0; 4]), "data_offsets is missing"),
        ];
        for (bytes, what) in cases.iter() {
            let err = SafeTensors::parse(bytes.clone(), "m").err().expect(what);
            assert!(err.contains(what), "expected '{}' in: {}", what, err);
        }
    }
}
