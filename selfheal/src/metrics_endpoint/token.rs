//! The scrape token: a file only its owner and group may read, its
//! contents the bearer token a scrape must present, compared in constant
//! time, and looked at again every [`TOKEN_RECHECK_EVERY`].

use std::{
    io::Read as _,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

/// The longest token file read.
pub const MAX_TOKEN_FILE: u64 = 4096;

/// Why a token file is refused (at start: `watch` does not begin).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// It cannot be opened or read.
    #[error("metrics token file {}: cannot read it: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// It is not a regular file.
    #[error("metrics token file {}: not a regular file", .path.display())]
    NotAFile { path: PathBuf },
    /// Anyone may read or write it.
    #[error(
        "metrics token file {}: mode {mode:04o} lets any user read or write it; make it readable \
         by its owner and group only (chmod 0600 or 0640; a Kubernetes Secret volume: \
         defaultMode: 0400)",
        .path.display()
    )]
    Exposed { path: PathBuf, mode: u32 },
    /// It holds nothing but white space.
    #[error("metrics token file {}: empty", .path.display())]
    Empty { path: PathBuf },
    /// It is larger than [`MAX_TOKEN_FILE`].
    #[error("metrics token file {}: larger than {MAX_TOKEN_FILE} bytes", .path.display())]
    TooLarge { path: PathBuf },
    /// The token holds a byte a bearer token cannot carry in a header.
    #[error(
        "metrics token file {}: the token holds a space, a control character or a non-ASCII \
         byte (a bearer token is printable ASCII)",
        .path.display()
    )]
    BadByte { path: PathBuf },
}

/// A bearer token, read from a file. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Token(pub(super) Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({} bytes)", self.0.len())
    }
}

impl Token {
    /// The token in `path`: a regular file (a symlink to one, as a
    /// Kubernetes Secret volume makes, is followed) that no "other" user
    /// may read or write, holding printable ASCII; white space around it
    /// (a trailing line end) is dropped. The mode is checked on the file
    /// opened, not on the path.
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        let read = |source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        if !meta.file_type().is_file() {
            return Err(TokenError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o006 != 0 {
            return Err(TokenError::Exposed {
                path: path.to_path_buf(),
                mode,
            });
        }
        if meta.size() > MAX_TOKEN_FILE {
            return Err(TokenError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        let mut bytes = Vec::new();
        file.take(MAX_TOKEN_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > MAX_TOKEN_FILE {
            return Err(TokenError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        let token = bytes.trim_ascii();
        if token.is_empty() {
            return Err(TokenError::Empty {
                path: path.to_path_buf(),
            });
        }
        if !token.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(TokenError::BadByte {
                path: path.to_path_buf(),
            });
        }
        Ok(Token(token.to_vec()))
    }

    /// Whether `given` is this token, in time that depends on the lengths
    /// only, never on where the first difference is.
    pub fn matches(&self, given: &[u8]) -> bool {
        ct_eq(&self.0, given)
    }
}

/// How often the token file is looked at again (a changed file's new
/// token replaces the old; a Kubernetes Secret is updated in place).
pub const TOKEN_RECHECK_EVERY: Duration = Duration::from_secs(5);

/// The token of a file, followed as the file changes: at most every
/// [`TOKEN_RECHECK_EVERY`] the file is `stat`ed, and when it is another
/// file or was modified, read and checked again as at start; a file that
/// no longer passes is logged and the last good token kept.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<TokenState>,
}

#[derive(Debug)]
struct TokenState {
    token: Token,
    identity: Option<FileIdentity>,
    checked: Instant,
}

/// What tells one version of a file from another.
type FileIdentity = (u64, u64, i64, i64, u64);

fn identity(path: &Path) -> Option<FileIdentity> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

impl TokenFile {
    /// The token in `path` ([`Token::from_file`]), to be followed.
    pub fn open(path: &Path) -> Result<TokenFile, TokenError> {
        let identity = identity(path);
        let token = Token::from_file(path)?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            state: Mutex::new(TokenState {
                token,
                identity,
                checked: Instant::now(),
            }),
        })
    }

    /// The token now (the file looked at again if it is time).
    pub fn current(&self) -> Option<Token> {
        let mut st = self.state.lock().ok()?;
        if st.checked.elapsed() >= TOKEN_RECHECK_EVERY {
            st.checked = Instant::now();
            let now = identity(&self.path);
            if now != st.identity {
                st.identity = now;
                match Token::from_file(&self.path) {
                    Ok(t) => {
                        st.token = t;
                        tracing::info!(
                            "metrics: the token file {} changed: its new token is required",
                            self.path.display()
                        );
                    }
                    Err(e) => {
                        tracing::error!("{e}; the last good token is still required");
                    }
                }
            }
        }
        Some(st.token.clone())
    }
}

/// `a == b` in time that depends on the longer length only: every byte
/// position is compared, the differences folded together.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = a.len() ^ b.len();
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn tokens_compare_whole() {
        for (a, b, eq) in [
            (&b"secret"[..], &b"secret"[..], true),
            (b"secret", b"secreT", false),
            (b"secret", b"secret2", false),
            (b"secret", b"", false),
            (b"", b"", true),
        ] {
            assert_eq!(ct_eq(a, b), eq, "{a:?} {b:?}");
        }
    }

    #[test]
    fn token_files() {
        let dir = std::env::temp_dir().join(format!("selfheal-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &[u8], mode: u32| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let good = write("good", b"abc123\n", 0o600);
        let t = Token::from_file(&good).expect("a good token file");
        assert!(t.matches(b"abc123"));
        std::os::unix::fs::symlink(&good, dir.join("link")).unwrap();
        assert!(
            Token::from_file(&dir.join("link")).is_ok(),
            "a symlink to one"
        );
        for (path, want) in [
            (dir.join("missing"), "cannot read it"),
            (write("empty", b" \n", 0o600), "empty"),
            (write("world-readable", b"abc", 0o644), "mode 0644"),
            (write("world-writable", b"abc", 0o602), "mode 0602"),
            (write("spaces", b"a b", 0o640), "printable ASCII"),
            (dir.clone(), "not a regular file"),
        ] {
            let e = Token::from_file(&path).expect_err(&path.display().to_string());
            let said = e.to_string();
            assert!(said.contains(want), "{said}");
            assert!(said.contains(&*path.to_string_lossy()), "{said}");
            assert!(!said.contains("abc"), "{said}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
