//! A walker over a spanned TOML tree (`toml::de::DeTable`) that knows where
//! every key stands: each read of a key checks its type, and each error
//! names the file, the line, the table's scope and the key. The config
//! parser and the helper's policy parser both read their files with it.

use std::{fmt, marker::PhantomData, ops::Range, path::Path, time::Duration};

use toml::{
    Spanned,
    de::{DeTable, DeValue},
};

use super::ConfigError;

/// An error the walker can build: the file at `path` is not valid at 1-based
/// `line` and `column`, for the reason `message` (which names the scope and
/// the key).
pub trait Invalid {
    /// The error for `path` at `line` and `column`.
    fn invalid(path: &Path, line: usize, column: usize, message: String) -> Self;
}

impl Invalid for ConfigError {
    fn invalid(path: &Path, line: usize, column: usize, message: String) -> Self {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            message,
        }
    }
}

/// The text being parsed and its file name, for errors of type `E`.
pub struct Cx<'a, E = ConfigError> {
    pub(crate) text: &'a str,
    path: &'a Path,
    error: PhantomData<fn() -> E>,
}

impl<'a, E: Invalid> Cx<'a, E> {
    /// The context of `text`, read from `path`.
    pub fn new(text: &'a str, path: &'a Path) -> Self {
        Cx {
            text,
            path,
            error: PhantomData,
        }
    }

    /// An error at `span`.
    pub fn error(&self, span: Range<usize>, message: String) -> E {
        let (line, column) = line_col(self.text, span.start);
        E::invalid(self.path, line, column, message)
    }

    /// An error about `key` at `span`, in the table `prefix` names
    /// (`grant 1: `; empty at the top level).
    pub fn key_error(
        &self,
        prefix: &str,
        key: &str,
        span: Range<usize>,
        what: impl fmt::Display,
    ) -> E {
        // A quoted key may hold anything: keep the message on one line.
        let key = if key.chars().any(char::is_control) {
            format!("{key:?}")
        } else {
            key.to_string()
        };
        self.error(span, format!("{prefix}key `{key}`: {what}"))
    }

    /// An error about `key` (in the table `prefix` names), whose value `v`
    /// is not of the `expected` type.
    pub fn type_error(&self, prefix: &str, key: &str, v: &Value<'_>, expected: &str) -> E {
        self.key_error(
            prefix,
            key,
            v.span(),
            format!("expected {expected}, found {}", v.get_ref().type_str()),
        )
    }

    /// The error for text that is not TOML.
    pub fn syntax(&self, e: &toml::de::Error) -> E {
        let span = e.span().unwrap_or(0..0);
        let reason: Vec<_> = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let mut message = format!("bad TOML: {}", reason.join("; "));
        // "duplicate key" points at the key: name it.
        if let Some(key) = self.text.get(span.clone())
            && !key.is_empty()
            && key.len() <= 80
            && !key.contains('\n')
            && message.ends_with("duplicate key")
        {
            message.push_str(&format!(" `{}`", key.trim()));
        }
        self.error(span, message)
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.bytes().filter(|b| *b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// A value of the tree and where it stands.
pub type Value<'i> = Spanned<DeValue<'i>>;

/// The keys of one table, with where it is (for messages) and its scope
/// (`agent "sol" upstream 1`).
pub struct Fields<'a, 'i, E = ConfigError> {
    pub(crate) cx: &'a Cx<'a, E>,
    /// The keys, their spans and their values, in file order.
    pub(crate) entries: Vec<(&'a str, Range<usize>, &'a Value<'i>)>,
    pub(crate) span: Range<usize>,
    pub(crate) scope: String,
}

impl<'a, 'i, E: Invalid> Fields<'a, 'i, E> {
    /// The keys of `table` at `span`, named `scope` in messages.
    pub fn new(
        cx: &'a Cx<'a, E>,
        table: &'a DeTable<'i>,
        span: Range<usize>,
        scope: String,
    ) -> Self {
        let mut entries: Vec<_> = table
            .iter()
            .map(|(k, v)| (k.get_ref().as_ref(), k.span(), v))
            .collect();
        entries.sort_by_key(|(_, span, _)| span.start);
        Fields {
            cx,
            entries,
            span,
            scope,
        }
    }

    /// `scope: `, or nothing at the top level.
    pub fn prefix(&self) -> String {
        if self.scope.is_empty() {
            String::new()
        } else {
            format!("{}: ", self.scope)
        }
    }

    /// An error about `key` at `span`.
    pub fn key_error(&self, key: &str, span: Range<usize>, what: impl fmt::Display) -> E {
        self.cx.key_error(&self.prefix(), key, span, what)
    }

    /// An error about the table as a whole.
    pub fn table_error(&self, what: impl fmt::Display) -> E {
        self.cx
            .error(self.span.clone(), format!("{}{what}", self.prefix()))
    }

    /// Fails on the first key (in file order) not in `allowed`.
    pub fn only(&self, allowed: &[&str]) -> Result<(), E> {
        for (key, span, _) in &self.entries {
            if !allowed.contains(key) {
                return Err(self.key_error(
                    key,
                    span.clone(),
                    format!("unknown key (expected {})", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// The value of `key` and the key's span.
    pub fn get(&self, key: &str) -> Option<(Range<usize>, &'a Value<'i>)> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, span, v)| (span.clone(), *v))
    }

    /// An error about `key`, whose value `v` is not of the `expected` type.
    pub fn type_error(&self, key: &str, v: &Value<'_>, expected: &str) -> E {
        self.cx.type_error(&self.prefix(), key, v, expected)
    }

    /// A string value and its span.
    pub fn string(&self, key: &str) -> Result<Option<(&'a str, Range<usize>)>, E> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::String(s) => Ok(Some((s.as_ref(), v.span()))),
                _ => Err(self.type_error(key, v, "a string")),
            },
        }
    }

    /// An integer value and its span.
    pub fn integer(&self, key: &str) -> Result<Option<(i64, Range<usize>)>, E> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                    .map(|n| Some((n, v.span())))
                    .map_err(|_| self.key_error(key, v.span(), "integer out of range")),
                _ => Err(self.type_error(key, v, "an integer")),
            },
        }
    }

    /// A duration (`"90s"`, `"5m"`), more than zero.
    pub fn duration(&self, key: &str) -> Result<Option<Duration>, E> {
        let Some((s, span)) = self.string(key)? else {
            return Ok(None);
        };
        let d = humantime::parse_duration(s).map_err(|e| {
            self.key_error(
                key,
                span.clone(),
                format!("bad duration {s:?}: {e} (examples: 500ms, 90s, 5m)"),
            )
        })?;
        if d.is_zero() {
            return Err(self.key_error(key, span, format!("duration {s:?} must be more than 0")));
        }
        Ok(Some(d))
    }

    /// A duration, or `"off"`: `Some(None)` for off, `None` when absent.
    pub fn duration_or_off(&self, key: &str) -> Result<Option<Option<Duration>>, E> {
        match self.string(key)? {
            Some(("off", _)) => Ok(Some(None)),
            Some(_) => self.duration(key).map(|d| d.map(Some)),
            None => Ok(None),
        }
    }

    /// A table value (inline or not) as `Fields`.
    pub fn table(&self, key: &str, scope: String) -> Result<Option<Fields<'a, 'i, E>>, E> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::Table(t) => Ok(Some(Fields::new(self.cx, t, v.span(), scope))),
                _ => Err(self.type_error(key, v, "a table")),
            },
        }
    }

    /// A boolean value.
    pub fn boolean(&self, key: &str) -> Result<Option<bool>, E> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::Boolean(b) => Ok(Some(*b)),
                _ => Err(self.type_error(key, v, "true or false")),
            },
        }
    }

    /// An array of strings (an argv).
    pub fn strings(&self, key: &str) -> Result<Option<WithSpan<Vec<String>>>, E> {
        let Some((_, v)) = self.get(key) else {
            return Ok(None);
        };
        let DeValue::Array(items) = v.get_ref() else {
            return Err(self.type_error(key, v, "an array of strings"));
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push(s.to_string()),
                _ => return Err(self.type_error(key, item, "a string")),
            }
        }
        Ok(Some((out, v.span())))
    }

    /// An array of tables (`[[key]]`, or `key = [{…}, …]`).
    #[allow(clippy::type_complexity)]
    pub fn tables(
        &self,
        key: &str,
        header: &str,
    ) -> Result<Option<Vec<(&'a DeTable<'i>, Range<usize>)>>, E> {
        let Some((_, v)) = self.get(key) else {
            return Ok(None);
        };
        let DeValue::Array(items) = v.get_ref() else {
            return Err(self.type_error(key, v, &format!("an array of tables ([[{header}]])")));
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::Table(t) => out.push((t, item.span())),
                _ => return Err(self.type_error(key, item, "an array of tables")),
            }
        }
        Ok(Some(out))
    }
}

/// A value and where it stands in the file.
pub type WithSpan<T> = (T, Range<usize>);

/// The field names of a struct (or a struct variant) read from its `{:?}`:
/// `Name { a: 1, b: [2] }` gives `a`, `b`. The key lists of the parsers are
/// checked against the types' fields with it.
#[cfg(test)]
pub(super) fn field_names(debug: &str) -> Vec<String> {
    let Some((_, body)) = debug.split_once('{') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut name = String::new();
    let (mut depth, mut quoted, mut escaped, mut in_name) = (0usize, false, false, true);
    for c in body.chars() {
        if quoted {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' if depth == 0 => break,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth == 0 => in_name = true,
            ':' if depth == 0 && in_name => {
                out.push(name.trim().to_string());
                name.clear();
                in_name = false;
            }
            _ if depth == 0 && in_name => name.push(c),
            _ => {}
        }
    }
    out
}

/// Checks that `keys` (a parser's key list) are the fields in `debug` (a
/// value's `{:?}`), each field spelled as its key or renamed by `rename`
/// (to one key, several, or none).
#[cfg(test)]
pub(super) fn assert_keys_are_fields(debug: &str, keys: &[&str], rename: &[(&str, &[&str])]) {
    let mut from_fields: Vec<String> = Vec::new();
    for field in field_names(debug) {
        match rename.iter().find(|(f, _)| *f == field) {
            Some((_, to)) => from_fields.extend(to.iter().map(|k| k.to_string())),
            None => from_fields.push(field),
        }
    }
    from_fields.sort();
    from_fields.dedup();
    let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(keys, from_fields, "the key list and the fields of {debug}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab\ncd", 99), (2, 3));
        assert_eq!(line_col("é\nx", 1), (1, 1));
    }

    #[test]
    fn field_names_from_debug() {
        assert_eq!(
            field_names(r#"X { a: 1, b: [2, 3], c: Y { d: "e, f: }" }, g: None }"#),
            ["a", "b", "c", "g"]
        );
        assert_eq!(field_names("Unit"), Vec::<String>::new());
    }
}
