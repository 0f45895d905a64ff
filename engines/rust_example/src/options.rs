//! Engine options: "key=value" items separated by ',' or newlines (include/kvdiff/engine.h).
//! Unknown keys and bad values are refused, naming what is accepted: never ignored.

/// Which caller the session is: the checked one, or one of the source document's mistakes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bug {
    /// The checked session: it passes its own position, each conversation gets a new cache.
    None,
    /// The session forgets to pass its position: index_pos 0 on every call (`pos0`).
    Pos0,
    /// One cache for every conversation and session, index_pos restarting at 0 (`reuse`).
    Reuse,
    /// TEST-ONLY: a context shift moves the cached rows but leaves the keys rotated for their old
    /// positions (`shift-not-rerotated`), to prove kvdiff's shift checks catch it.
    ShiftNotRerotated,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub bug: Bug,
    /// Positions a session may hold: default and upper bound max_position_embeddings.
    pub max_length: usize,
}

const KNOWN: &str =
    "the Rust example engine knows: bug=none|pos0|reuse|shift-not-rerotated, max_length=N";

impl Options {
    pub fn parse(text: &str, max_position_embeddings: usize) -> Result<Options, String> {
        let mut options = Options { bug: Bug::None, max_length: max_position_embeddings };
        for item in text.split([',', '\n']).filter(|i| !i.is_empty()) {
            let (key, value) = match item.find('=') {
                Some(at) => (&item[..at], &item[at + 1..]),
                None => return Err(format!("option '{}': expected key=value ({})", item, KNOWN)),
            };
            match key {
                "bug" => options.bug = parse_bug(value)?,
                "max_length" => {
                    options.max_length = parse_max_length(value, max_position_embeddings)?
                }
                _ => return Err(format!("unknown option '{}' ({})", key, KNOWN)),
            }
        }
        Ok(options)
    }
}

fn parse_bug(value: &str) -> Result<Bug, String> {
    match value {
        "none" => Ok(Bug::None),
        "pos0" => Ok(Bug::Pos0),
        "reuse" => Ok(Bug::Reuse),
        "shift-not-rerotated" => Ok(Bug::ShiftNotRerotated),
        _ => {
            Err(format!("option bug={}: expected none, pos0, reuse or shift-not-rerotated", value))
        }
    }
}

fn parse_max_length(value: &str, max_pos: usize) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 && n <= max_pos => Ok(n),
        _ => Err(format!(
            "option max_length={}: expected an integer in [1, {}] (max_position_embeddings)",
            value, max_pos
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_items_and_refuses_the_unknown() {
        let o = Options::parse("bug=reuse,max_length=64\n", 512).unwrap();
        assert_eq!(o, Options { bug: Bug::Reuse, max_length: 64 });
        assert_eq!(Options::parse("", 512).unwrap().bug, Bug::None);
        assert!(Options::parse("kv=f16", 512)
            .unwrap_err()
            .starts_with("unknown option 'kv' (the Rust"));
        assert!(Options::parse("bug=sometimes", 512)
            .unwrap_err()
            .contains("expected none, pos0, reuse or shift-not-rerotated"));
        assert_eq!(
            Options::parse("bug=shift-not-rerotated", 512).unwrap().bug,
            Bug::ShiftNotRerotated
        );
        assert!(Options::parse("max_length=513", 512).unwrap_err().contains("[1, 512]"));
        assert!(Options::parse("bug", 512).unwrap_err().contains("expected key=value"));
    }
}
