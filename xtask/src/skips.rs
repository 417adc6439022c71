//! The skip list of a test run: each skip the tests recorded (one JSON file
//! each: `test`, `kind`, `why`, `ci_never_needs`, `vm_only`), printed at the
//! end of `cargo xtask test` (libtest hides a passing test's stderr) and
//! judged: under CI, a skip for what CI's machine has fails the run, and so
//! does a VM-only test that `--no-vm` dropped.

use std::path::Path;

use anyhow::{Result, bail};

/// One recorded skip.
#[derive(Debug)]
pub struct Skipped {
    pub test: String,
    pub kind: String,
    pub why: String,
    pub ci_never_needs: bool,
    pub vm_only: bool,
}

/// A record's fields; a missing or mistyped field is an error naming it.
fn parse(text: &str) -> Result<Skipped, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let text = |k: &str| {
        v[k].as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("no string {k}"))
    };
    let flag = |k: &str| v[k].as_bool().ok_or_else(|| format!("no boolean {k}"));
    Ok(Skipped {
        test: text("test")?,
        kind: text("kind")?,
        why: text("why")?,
        ci_never_needs: flag("ci_never_needs")?,
        vm_only: flag("vm_only")?,
    })
}

/// The skips recorded in `dir`, sorted by test; an unreadable record is
/// listed as such (a skip is never lost from the count).
pub fn read(dir: &Path) -> Vec<Skipped> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut skips: Vec<Skipped> = entries
        .flatten()
        .map(|e| {
            let path = e.path();
            std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| parse(&t))
                .unwrap_or_else(|e| Skipped {
                    test: path.display().to_string(),
                    kind: "unreadable".into(),
                    why: e,
                    ci_never_needs: true,
                    vm_only: false,
                })
        })
        .collect();
    skips.sort_by(|a, b| (&a.test, &a.why).cmp(&(&b.test, &b.why)));
    skips
}

/// Prints the list and its count; with `no_vm`, the VM-only tests as
/// dropped.
pub fn print(skips: &[Skipped], no_vm: bool) {
    eprintln!("\nskipped tests: {}", skips.len());
    for s in skips {
        eprintln!("  [{}] {}: {}", s.kind, s.test, s.why);
    }
    if no_vm {
        for s in skips.iter().filter(|s| s.vm_only) {
            eprintln!(
                "xtask: --no-vm DROPPED {}: only `cargo xtask vm-test` runs it",
                s.test
            );
        }
    }
}

/// Under `ci`, fails naming the skips CI's machine should never need
/// (and, with `no_vm`, the VM-only tests no VM ran).
pub fn judge(skips: &[Skipped], ci: bool, no_vm: bool) -> Result<()> {
    if !ci {
        return Ok(());
    }
    let bad: Vec<String> = skips
        .iter()
        .filter(|s| s.ci_never_needs || (no_vm && s.vm_only))
        .map(|s| format!("{} ({}): {}", s.test, s.kind, s.why))
        .collect();
    if !bad.is_empty() {
        bail!(
            "{} test(s) skipped for what CI's machine has:\n  {}",
            bad.len(),
            bad.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip(kind: &str, ci_never_needs: bool, vm_only: bool) -> Skipped {
        Skipped {
            test: format!("t_{kind}"),
            kind: kind.into(),
            why: "why".into(),
            ci_never_needs,
            vm_only,
        }
    }

    #[test]
    fn ci_fails_on_what_it_never_needs_and_on_dropped_vm_tests() {
        let host = skip("host", false, false);
        let vm = skip("vm", false, true);
        let tool = skip("tool", true, false);
        assert!(judge(&[host, vm], true, false).is_ok());
        let vm = skip("vm", false, true);
        let e = judge(&[vm], true, true).unwrap_err().to_string();
        assert!(e.contains("t_vm (vm)"), "{e}");
        let e = judge(&[tool], true, false).unwrap_err().to_string();
        assert!(
            e.contains("1 test(s)") && e.contains("t_tool (tool): why"),
            "{e}"
        );
        assert!(judge(&[skip("tool", true, false)], false, true).is_ok());
    }

    #[test]
    fn a_record_is_read_and_an_unreadable_one_still_counts() {
        let dir = std::env::temp_dir().join(format!("xtask-skips-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("1-0.json"),
            r#"{"test":"a","kind":"tool","why":"no podman","ci_never_needs":true,"vm_only":false}"#,
        )
        .unwrap();
        std::fs::write(dir.join("1-1.json"), "{torn").unwrap();
        let skips = read(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(skips.len(), 2);
        let good = skips
            .iter()
            .find(|s| s.test == "a")
            .expect("the good record");
        assert_eq!(
            (good.kind.as_str(), good.why.as_str()),
            ("tool", "no podman")
        );
        let torn = skips
            .iter()
            .find(|s| s.kind == "unreadable")
            .expect("the torn one");
        assert!(
            torn.ci_never_needs && torn.test.ends_with("1-1.json"),
            "{torn:?}"
        );
    }
}
