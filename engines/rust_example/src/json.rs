//! A small, strict JSON reader: enough for config.json and a safetensors header, and nothing
//! guessed. Duplicate keys, trailing text, nesting deeper than `MAX_DEPTH`, invalid escapes and
//! non-finite numbers are refused with the byte offset where reading stopped.

use std::fmt;

/// Deeper than any config.json or safetensors header; bounds the recursion on hostile input.
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Value>),
    /// Members in file order (keys are unique: a duplicate is refused).
    Object(Vec<(String, Value)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct JsonError {
    pub offset: usize,
    pub what: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed JSON at byte {}: {}", self.offset, self.what)
    }
}

/// Parses one JSON value that spans the whole text (whitespace around it allowed).
pub fn parse(text: &[u8]) -> Result<Value, JsonError> {
    let mut reader = Reader { text, at: 0 };
    let value = reader.value(0)?;
    reader.skip_whitespace();
    if reader.at != text.len() {
        return Err(reader.error("text after the value"));
    }
    Ok(value)
}

impl Value {
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// A non-negative integer that f64 holds exactly (below 2^53), as sizes and offsets are.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Number(n) if n >= 0.0 && n.fract() == 0.0 && n < 9_007_199_254_740_992.0 => {
                Some(n as u64)
            }
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Number(n) => Some(n),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A short name of the value's kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }
}

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn error(&self, what: &str) -> JsonError {
        JsonError { offset: self.at, what: what.to_string() }
    }

    fn skip_whitespace(&mut self) {
        while self.at < self.text.len()
            && matches!(self.text[self.at], b' ' | b'\t' | b'\n' | b'\r')
        {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<(), JsonError> {
        self.skip_whitespace();
        if self.peek() != Some(byte) {
            return Err(self.error(&format!("expected '{}'", byte as char)));
        }
        self.at += 1;
        Ok(())
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.error(&format!("nested deeper than {}", MAX_DEPTH)));
        }
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-') | Some(b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("unexpected end of text")),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, JsonError> {
        if !self.text[self.at..].starts_with(word.as_bytes()) {
            return Err(self.error(&format!("expected {}", word)));
        }
        self.at += word.len();
        Ok(value)
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.expect(b'{')?;
        let mut members: Vec<(String, Value)> = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_whitespace();
            let key_at = self.at;
            let key = self.string()?;
            if members.iter().any(|(k, _)| *k == key) {
                return Err(JsonError {
                    offset: key_at,
                    what: format!("duplicate key \"{}\"", key),
                });
            }
            self.expect(b':')?;
            let value = self.value(depth + 1)?;
            members.push((key, value));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.at;
        let digits = |r: &mut Reader| -> usize {
            let from = r.at;
            while matches!(r.peek(), Some(b'0'..=b'9')) {
                r.at += 1;
            }
            r.at - from
        };
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let leading_zero = self.peek() == Some(b'0');
        let int_digits = digits(self);
        if int_digits == 0 || (leading_zero && int_digits > 1) {
            return Err(JsonError { offset: start, what: "malformed number".to_string() });
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if digits(self) == 0 {
                return Err(self.error("expected a digit after '.'"));
            }
        }
        if matches!(self.peek(), Some(b'e') | Some(b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+') | Some(b'-')) {
                self.at += 1;
            }
            if digits(self) == 0 {
                return Err(self.error("expected a digit in the exponent"));
            }
        }
        // The bytes are ASCII digits, signs, '.' and 'e' only: valid UTF-8.
        let text = std::str::from_utf8(&self.text[start..self.at]).unwrap_or("");
        match text.parse::<f64>() {
            Ok(n) if n.is_finite() => Ok(Value::Number(n)),
            _ => Err(JsonError { offset: start, what: format!("number {} out of range", text) }),
        }
    }

    fn string(&mut self) -> Result<String, JsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a string"));
        }
        self.at += 1;
        let mut bytes = Vec::new();
        loop {
            let byte = match self.peek() {
                Some(b) => b,
                None => return Err(self.error("unterminated string")),
            };
            self.at += 1;
            match byte {
                b'"' => break,
                b'\\' => self.escape(&mut bytes)?,
                0..=0x1f => return Err(self.error("control character in a string")),
                _ => bytes.push(byte),
            }
        }
        String::from_utf8(bytes).map_err(|_| self.error("string is not valid UTF-8"))
    }

    /// One escape after its backslash, appended to `out` as UTF-8.
    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        let byte = self.peek().ok_or_else(|| self.error("unterminated escape"))?;
        self.at += 1;
        let simple = match byte {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(8),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'u' => None,
            _ => return Err(self.error("invalid escape")),
        };
        if let Some(b) = simple {
            out.push(b);
            return Ok(());
        }
        let mut code = self.hex4()?;
        if (0xD800..0xDC00).contains(&code) {
            // A high surrogate must be followed by \u and a low one.
            if !self.text[self.at..].starts_with(b"\\u") {
                return Err(self.error("unpaired surrogate"));
            }
            self.at += 2;
            let low = self.hex4()?;
            if !(0xDC00..0xE000).contains(&low) {
                return Err(self.error("unpaired surrogate"));
            }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        let c = char::from_u32(code).ok_or_else(|| self.error("invalid \\u escape"))?;
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let end = self.at + 4;
        let hex = self.text.get(self.at..end).ok_or_else(|| self.error("short \\u escape"))?;
        let text = std::str::from_utf8(hex).map_err(|_| self.error("invalid \\u escape"))?;
        let code = u32::from_str_radix(text, 16).map_err(|_| self.error("invalid \\u escape"))?;
        self.at = end;
        Ok(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_values() {
        let v = parse(br#" {"a": [1, -2.5e1, true, null], "b": {"c": "x\u00e9\"y"}} "#).unwrap();
        assert_eq!(v.get("b").unwrap().get("c").unwrap().as_str(), Some("x\u{e9}\"y"));
        match v.get("a").unwrap() {
            Value::Array(items) => assert_eq!(items[1], Value::Number(-25.0)),
            other => panic!("expected an array, got {:?}", other),
        }
    }

    #[test]
    fn refuses_what_is_not_json() {
        let cases: [(&[u8], &str); 8] = [
            (b"{\"a\":1,\"a\":2}", "duplicate key \"a\""),
            (b"{\"a\":1} x", "text after the value"),
            (b"[1,]", "expected a value"),
            (b"01", "malformed number"),
            (b"{\"a\" 1}", "expected ':'"),
            (b"\"abc", "unterminated string"),
            (b"1e999", "out of range"),
            (b"\"\\ud800\"", "unpaired surrogate"),
        ];
        for (text, what) in cases.iter() {
            let err = parse(text).unwrap_err();
            assert!(err.what.contains(what), "{:?}: {}", String::from_utf8_lossy(text), err);
        }
    }

    #[test]
    fn refuses_deep_nesting_without_overflowing_the_stack() {
        let text = vec![b'['; 100_000];
        assert!(parse(&text).unwrap_err().what.contains("nested deeper"));
    }

    #[test]
    fn integers_are_exact_or_refused() {
        assert_eq!(parse(b"123456789").unwrap().as_u64(), Some(123_456_789));
        assert_eq!(parse(b"1.5").unwrap().as_u64(), None);
        assert_eq!(parse(b"-1").unwrap().as_u64(), None);
    }
}
