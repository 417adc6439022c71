//! `selfheal install`: writes the systemd units of `dist/systemd/` with this
//! binary's path, and says what it wrote and what to run next. It starts
//! nothing itself.

use std::{io::Write as _, path::PathBuf};

use anyhow::Context as _;

use super::{Error, Finished};

/// Write the systemd units: `--user` the timer that runs `selfheal check`
/// every 30 s (or, with `--watch`, a service running `selfheal watch`, a
/// check every 5 s); `--system` the privileged helper's socket and hardened
/// service.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["user", "system"])))]
pub struct Args {
    /// The user timer and service (`~/.config/systemd/user/`).
    #[arg(long)]
    user: bool,
    /// The helper's socket and service (`/etc/systemd/system/`).
    #[arg(long)]
    system: bool,
    /// With --user: instead of the timer, a service that runs `selfheal
    /// watch` (a check every 5 s, one long-running process) for agents
    /// that must be healed within seconds rather than half a minute.
    #[arg(long, conflicts_with = "system")]
    watch: bool,
    /// The selfheal binary the units run (default: this one).
    #[arg(long, value_name = "PATH")]
    bin: Option<PathBuf>,
    /// Write into this directory instead of systemd's.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

const USER_UNITS: [(&str, &str); 2] = [
    (
        "selfheal.service",
        include_str!("../../../dist/systemd/selfheal.service"),
    ),
    (
        "selfheal.timer",
        include_str!("../../../dist/systemd/selfheal.timer"),
    ),
];

const WATCH_UNITS: [(&str, &str); 1] = [(
    "selfheal-watch.service",
    include_str!("../../../dist/systemd/selfheal-watch.service"),
)];

const SYSTEM_UNITS: [(&str, &str); 2] = [
    (
        "selfheal-helper.socket",
        include_str!("../../../dist/systemd/selfheal-helper.socket"),
    ),
    (
        "selfheal-helper.service",
        include_str!("../../../dist/systemd/selfheal-helper.service"),
    ),
];

pub fn run(args: Args) -> Result<Finished, Error> {
    let bin = match args.bin {
        Some(b) => b,
        None => std::env::current_exe().context("cannot tell where this binary is")?,
    };
    let bin = bin
        .canonicalize()
        .with_context(|| format!("no binary at {}", bin.display()))?;
    let bin_text = bin.to_str().context("the binary's path is not UTF-8")?;
    if bin_text.contains(char::is_whitespace) {
        return Err(anyhow::anyhow!(
            "the binary's path {bin_text:?} contains whitespace; install it elsewhere"
        )
        .into());
    }
    let (units, default_dir, next): (&[(&str, &str)], PathBuf, &str) = if args.user {
        let home = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .context("neither XDG_CONFIG_HOME nor HOME is set")?;
        if args.watch {
            (
                &WATCH_UNITS,
                home.join("systemd/user"),
                "systemctl --user daemon-reload && systemctl --user enable --now selfheal-watch.service",
            )
        } else {
            (
                &USER_UNITS,
                home.join("systemd/user"),
                "systemctl --user daemon-reload && systemctl --user enable --now selfheal.timer",
            )
        }
    } else {
        (
            &SYSTEM_UNITS,
            PathBuf::from("/etc/systemd/system"),
            "systemctl daemon-reload && systemctl enable --now selfheal-helper.socket",
        )
    };
    if args.system {
        // The helper runs this binary as root: refuse one that anyone but
        // root could have written or could replace (trust.rs's rule, with
        // root the only trusted owner).
        if let Err(e) = selfheal::trust::open_trusted(&bin, 0, selfheal::trust::Sticky::AboveItsOwn)
        {
            let why = match e {
                selfheal::trust::TrustError::Read { path, error } => {
                    format!("cannot examine {}: {error}", path.display())
                }
                selfheal::trust::TrustError::Untrusted { reason } => reason,
            };
            return Err(anyhow::anyhow!(
                "refusing to write a root unit that runs {bin_text}: {why}. Install the binary \
                 where only root can change it, e.g. `install -o root -g root -m 0755 \
                 {bin_text} /usr/local/bin/selfheal`, then run `selfheal install --system \
                 --bin /usr/local/bin/selfheal`"
            )
            .into());
        }
    }
    let dir = args.dir.unwrap_or(default_dir);
    // What was done, said once everything is written (a closed stdout
    // stops no unit from being written), each line escaped.
    let mut said = Vec::new();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, template) in units {
        let path = dir.join(name);
        let text = template.replace("@BIN@", bin_text);
        let existed = path.exists();
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        said.push(format!(
            "{} {}",
            if existed { "replaced" } else { "wrote" },
            path.display()
        ));
    }
    said.push(format!("units run {bin_text}"));
    said.push(format!("next: {next}"));
    // One of the two is enough (the state lock makes both take turns):
    // the other, when enabled here, is named.
    if args.user {
        let (other, wants) = if args.watch {
            ("selfheal.timer", "timers.target.wants")
        } else {
            ("selfheal-watch.service", "default.target.wants")
        };
        if dir.join(wants).join(other).exists() {
            said.push(format!(
                "note: {other} is enabled too; the timer and the watch service do the same \
                 work, keep one: `systemctl --user disable --now {other}`"
            ));
        }
    }
    if args.user
        && let Some(note) = linger_note()
    {
        said.push(note);
    }
    let mut out = std::io::stdout().lock();
    for line in said {
        writeln!(out, "{}", selfheal_core::text::escape(&line))
            .context("cannot write the report")?;
    }
    Ok(Finished::Done)
}

/// What to do when this user's systemd manager does not linger: without
/// it the user's timer runs only while the user is logged in (checked with
/// `loginctl`; nothing is said where it cannot tell).
fn linger_note() -> Option<String> {
    let uid = selfheal::sys::creds::euid();
    if uid == 0 || !std::path::Path::new("/run/systemd/system").exists() {
        return None;
    }
    let out = std::process::Command::new("loginctl")
        .args([
            "show-user",
            &uid.to_string(),
            "--property=Linger",
            "--value",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let value = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // `loginctl show-user` fails for a user with no session and no linger.
    (!out.status.success() || value == "no").then(|| {
        format!(
            "note: uid {uid} has no linger: the timer runs only while you are logged in. \
             Run `sudo loginctl enable-linger {uid}` (or ask an administrator) so it runs always."
        )
    })
}
