//! The state file's content: the envelope `check` saves its history in
//! (`{"version": 1, "saved_unix_ms": …, "data": …}`) and its decoding,
//! which says what is wrong with bad content rather than failing. Where the
//! file lives, its lock, and crash-safe saving are the edge's
//! (`selfheal::store`).

use serde::{Serialize, de::DeserializeOwned};

/// The on-disk format version this build writes and reads.
pub const FORMAT_VERSION: u64 = 1;

/// What is saved: the format version, when, and the value.
#[derive(Serialize)]
pub struct EnvelopeOut<'a, T> {
    pub version: u64,
    pub saved_unix_ms: u64,
    pub data: &'a T,
}

/// The value and its save time, or what is wrong with the content (the
/// words follow the file's name: `is corrupt (…)`, `is from a newer
/// selfheal …`).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, Option<u64>), String> {
    let doc: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("is corrupt ({e})"))?;
    let serde_json::Value::Object(mut doc) = doc else {
        return Err("is corrupt (not a JSON object)".into());
    };
    let version = match doc.get("version") {
        None => return Err("is corrupt (no version)".into()),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("is corrupt (version {v} is not a number)"))?,
    };
    if version > FORMAT_VERSION {
        return Err(format!(
            "is from a newer selfheal (format version {version}; this build reads {FORMAT_VERSION})"
        ));
    }
    if version != FORMAT_VERSION {
        return Err(format!("is corrupt (unknown format version {version})"));
    }
    let saved = doc.get("saved_unix_ms").and_then(|v| v.as_u64());
    let data = doc
        .remove("data")
        .ok_or_else(|| "is corrupt (no data)".to_string())?;
    let value = serde_json::from_value(data)
        .map_err(|e| format!("does not fit this build's state ({e})"))?;
    Ok((value, saved))
}
