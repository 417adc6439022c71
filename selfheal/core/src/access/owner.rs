//! Whom the helper counts a caller against, and how much each may hold:
//! the real owner of a caller (its user namespace's owner, or the owner of
//! the `/etc/subuid` range its uid is in), the parser of `/etc/subuid`,
//! and the fair-share rules for the helper's limits. Pure: the edge reads
//! the file, the namespace and the passwd database
//! (`selfheal::helper::access::owner`).
//!
//! # Who the owner is
//!
//! A kernel uid is not a person: one user with an `/etc/subuid` range (every
//! rootless Podman or Docker host) runs processes as thousands of uids, and
//! a user namespace lets them appear as any of them. The helper counts
//! each of its limits against the *owner*:
//!
//! 1. uid 0 is root, always (the policy treats it as root too);
//! 2. a caller in a user namespace below the helper's is counted to the uid
//!    that made the outermost one (`NS_GET_OWNER_UID` walked with
//!    `NS_GET_PARENT`), unless root made it: a namespace root made for
//!    others (a rootful runtime's) holds uids that are not root's, and
//!    counting them to root would let them crowd root out — they are
//!    counted by their uid, as in rule 3;
//! 3. otherwise the caller's uid, as the helper sees it;
//! 4. and the uid so found, when it lies in a range of `/etc/subuid`, is
//!    counted to that range's owner.
//!
//! A caller whose namespace cannot be read is counted by rule 3 and 4
//! (conservatively: an unprivileged user can map into a namespace only its
//! own uid, or its `/etc/subuid` ranges through `newuidmap`, so its uid
//! gives the same owner; only a namespace whose map root wrote differs).
//!
//! Ranges owned by root, and ranges that hold uid 0, are skipped: root's
//! subordinate uids are not root, and no uid is counted to root but root.
//!
//! # Fair shares
//!
//! - Connections: root keeps `root_reserve` of them; the others share the
//!   rest, each owner up to `pool / owners` (the owners holding one,
//!   counting the newcomer) and never more than its per-owner cap. When
//!   the pool is full, the oldest idle connection of the largest holder
//!   above its share is closed to admit an owner below its share: no set
//!   of owners can keep a third out.
//! - Escalations (pending SIGKILLs, which cannot be taken back): root has a
//!   reserve of its own outside the table; each other owner up to
//!   `table / (owners + 1)` of it, counting the newcomer, and its cap: one
//!   share is left for the next owner, and the table fills only when many
//!   real owners hold theirs at once (1,024 with 64 per owner: 17 of them).
//!   A pending escalation ends by its grace (at most two minutes) or the
//!   process's exit.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
};

/// Most bytes of `/etc/subuid` read; the rest is ignored (and said).
pub const MAX_SUBUID_BYTES: usize = 1 << 20;

/// Most ranges kept from `/etc/subuid`; later lines are ignored (and said).
pub const MAX_SUBUID_RANGES: usize = 65_536;

/// Most skipped lines whose reason is kept (all are counted).
const MAX_SKIPPED_KEPT: usize = 16;

/// One range of `/etc/subuid`: `count` uids from `start`, owned by `owner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubuidRange {
    pub owner: u32,
    pub start: u32,
    pub count: u32,
    /// 1-based line of the file.
    pub line: usize,
}

impl SubuidRange {
    fn end(&self) -> u64 {
        u64::from(self.start) + u64::from(self.count)
    }

    fn contains(&self, uid: u32) -> bool {
        uid >= self.start && u64::from(uid) < self.end()
    }
}

/// A line of `/etc/subuid` that was not used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub line: usize,
    pub reason: String,
}

/// The ranges of `/etc/subuid`, sorted and without overlaps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subuids {
    ranges: Vec<SubuidRange>,
}

/// What parsing `/etc/subuid` gave: the ranges and what was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedSubuids {
    pub subuids: Subuids,
    /// The first skipped lines, with their reasons.
    pub skipped: Vec<Skipped>,
    /// How many lines were skipped in all.
    pub skipped_count: usize,
    /// Lines after [`MAX_SUBUID_RANGES`] ranges were not read.
    pub truncated: bool,
}

impl ParsedSubuids {
    /// One line for the log: how many ranges, what was skipped.
    pub fn describe(&self) -> String {
        let mut s = format!("{} subordinate uid ranges", self.subuids.len());
        if self.skipped_count > 0 {
            let first: Vec<String> = self
                .skipped
                .iter()
                .map(|k| format!("line {}: {}", k.line, k.reason))
                .collect();
            s.push_str(&format!(
                "; {} lines skipped ({})",
                self.skipped_count,
                first.join("; ")
            ));
        }
        if self.truncated {
            s.push_str(&format!(
                "; lines after the first {MAX_SUBUID_RANGES} ranges ignored"
            ));
        }
        s
    }
}

impl Subuids {
    /// Parses `/etc/subuid` text (`name_or_uid:start:count` lines; empty
    /// lines and `#` comments allowed). `lookup` maps a user name to its
    /// uid (the passwd database); a field of digits is a uid. Bad lines
    /// are skipped with a reason, never an error.
    pub fn parse(text: &str, mut lookup: impl FnMut(&str) -> Option<u32>) -> ParsedSubuids {
        let mut out = ParsedSubuids::default();
        let mut names: HashMap<String, Option<u32>> = HashMap::new();
        let mut ranges = Vec::new();
        let skip = |out: &mut ParsedSubuids, line: usize, reason: String| {
            out.skipped_count += 1;
            if out.skipped.len() < MAX_SKIPPED_KEPT {
                out.skipped.push(Skipped { line, reason });
            }
        };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            if ranges.len() >= MAX_SUBUID_RANGES {
                out.truncated = true;
                break;
            }
            let fields: Vec<&str> = l.split(':').collect();
            let [name, start, count] = fields[..] else {
                skip(&mut out, line, "not name:start:count".into());
                continue;
            };
            let (Ok(start), Ok(count)) = (start.trim().parse::<u32>(), count.trim().parse::<u32>())
            else {
                skip(&mut out, line, "start or count is not a number".into());
                continue;
            };
            if count == 0 {
                skip(&mut out, line, "an empty range".into());
                continue;
            }
            // uid 4294967295 is (uid_t)-1, never a uid.
            if u64::from(start) + u64::from(count) > u64::from(u32::MAX) {
                skip(&mut out, line, "the range runs past the last uid".into());
                continue;
            }
            let name = name.trim();
            let owner = if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
                name.parse::<u32>().ok()
            } else if name.is_empty() {
                None
            } else {
                *names
                    .entry(name.to_string())
                    .or_insert_with(|| lookup(name))
            };
            let Some(owner) = owner else {
                let shown: String = name.chars().take(32).collect();
                skip(&mut out, line, format!("no user {shown:?}"));
                continue;
            };
            if owner == 0 || owner == u32::MAX {
                skip(
                    &mut out,
                    line,
                    "owned by root: root's subordinate uids are counted each as its own".into(),
                );
                continue;
            }
            if start == 0 {
                skip(&mut out, line, "the range holds uid 0".into());
                continue;
            }
            ranges.push(SubuidRange {
                owner,
                start,
                count,
                line,
            });
        }
        // Sorted by start; a range overlapping an earlier line's is skipped
        // (the first line wins: a uid has one owner).
        ranges.sort_by_key(|r| (r.start, r.line));
        let mut kept: Vec<SubuidRange> = Vec::with_capacity(ranges.len());
        let mut overlapping = Vec::new();
        for r in ranges {
            match kept.last() {
                Some(prev) if u64::from(r.start) < prev.end() => {
                    // Keep the one from the earlier line.
                    if r.line < prev.line {
                        overlapping.push((prev.line, r.line));
                        kept.pop();
                        kept.push(r);
                    } else {
                        overlapping.push((r.line, prev.line));
                    }
                }
                _ => kept.push(r),
            }
        }
        overlapping.sort_unstable();
        for (line, other) in overlapping {
            skip(
                &mut out,
                line,
                format!("overlaps the range of line {other}"),
            );
        }
        out.subuids = Subuids { ranges: kept };
        out
    }

    /// The range `uid` is in, if any.
    pub fn range_of(&self, uid: u32) -> Option<&SubuidRange> {
        let i = self.ranges.partition_point(|r| r.start <= uid);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        r.contains(uid).then_some(r)
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// What the edge could learn of a caller's user namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// The helper's own user namespace.
    Initial,
    /// Below the helper's; the outermost of them was made by this uid (as
    /// the helper sees it).
    OwnedBy(u32),
    /// It could not be read, and why.
    Unreadable(String),
}

/// Why a caller counts against its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Basis {
    /// Its own uid.
    Own,
    /// The owner of its user namespace.
    Namespace,
    /// The owner of the `/etc/subuid` range of `uid` (its own uid, or its
    /// namespace's owner) from line `line`.
    Subuid { uid: u32, line: usize },
}

/// Whom one caller counts against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// The owner's uid: the key of every limit.
    pub owner: u32,
    /// The caller's uid, as the helper sees it.
    pub uid: u32,
    pub basis: Basis,
    /// Why its namespace was not used, when it could not be read.
    pub unreadable: Option<String>,
}

impl Account {
    /// The caller counts against itself (tests, callers of no namespace).
    pub fn own(uid: u32) -> Account {
        Account {
            owner: uid,
            uid,
            basis: Basis::Own,
            unreadable: None,
        }
    }

    /// Root: uid 0 counted as itself, the only one root's reserves serve.
    pub fn is_root(&self) -> bool {
        self.owner == 0
    }
}

impl fmt::Display for Account {
    /// `uid 1000`, or `uid 1000 (the owner of uid 100005's /etc/subuid
    /// range)` when the owner is not the caller's uid.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {}", self.owner)?;
        match &self.basis {
            Basis::Own => Ok(()),
            Basis::Namespace => write!(f, " (the owner of uid {}'s user namespace)", self.uid),
            Basis::Subuid { uid, line } if *uid == self.uid => write!(
                f,
                " (the owner of uid {uid}'s subordinate uid range, line {line})"
            ),
            Basis::Subuid { uid, line } => write!(
                f,
                " (the owner of uid {}'s user namespace is uid {uid}, a subordinate uid of line {line})",
                self.uid
            ),
        }
    }
}

/// Whom a caller of kernel uid `uid` (as the helper sees it) in namespace
/// `ns` counts against (the rules of the module's doc).
pub fn account(uid: u32, ns: &Namespace, subuids: &Subuids) -> Account {
    if uid == 0 {
        return Account::own(0);
    }
    let (base, basis, unreadable) = match ns {
        Namespace::OwnedBy(o) if *o != 0 && *o != u32::MAX => (*o, Basis::Namespace, None),
        Namespace::Unreadable(why) => (uid, Basis::Own, Some(why.clone())),
        _ => (uid, Basis::Own, None),
    };
    let (owner, basis) = match subuids.range_of(base) {
        Some(r) => (
            r.owner,
            Basis::Subuid {
                uid: base,
                line: r.line,
            },
        ),
        None => (base, basis),
    };
    Account {
        owner,
        uid,
        basis,
        unreadable,
    }
}

/// Each owner's share of `pool` when `owners` share it: at least 1, at
/// most `cap`.
pub fn fair_share(pool: usize, owners: usize, cap: usize) -> usize {
    (pool / owners.max(1)).min(cap).max(1)
}

/// The connection limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections served at once, in all.
    pub max: usize,
    /// Most one owner may hold.
    pub per_owner: usize,
    /// Of `max`, how many only root may use.
    pub root_reserve: usize,
}

/// One open connection, as admission sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenConn {
    pub owner: u32,
    /// When it last became idle (an ever-growing sequence number), `None`
    /// while it serves a request.
    pub idle_since: Option<u64>,
}

/// What to do with a new connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Admit,
    /// Close `open[index]` (its owner holds `held`, above its `share`),
    /// then admit.
    Evict {
        index: usize,
        owner: u32,
        held: usize,
        share: usize,
    },
    /// Refuse, with why.
    Busy(String),
}

/// Whether a connection of `who` may open now, beside `open`.
pub fn admit(open: &[OpenConn], who: &Account, limits: &ConnLimits) -> Admission {
    let max = limits.max.max(1);
    let reserve = limits.root_reserve.min(max - 1);
    let pool = max - reserve;
    let per_owner = limits.per_owner.max(1);
    let mut held: BTreeMap<u32, usize> = BTreeMap::new();
    for c in open {
        *held.entry(c.owner).or_default() += 1;
    }
    let mine = held.get(&who.owner).copied().unwrap_or(0);
    if mine >= per_owner {
        return Admission::Busy(format!(
            "{who} has {mine} connections open (at most {per_owner})"
        ));
    }
    let others: usize = held.iter().filter(|(o, _)| **o != 0).map(|(_, n)| n).sum();
    let owners = held.keys().filter(|o| **o != 0).count() + usize::from(mine == 0);
    let share = fair_share(pool, owners, per_owner);
    let room = open.len() < max && (who.is_root() || others < pool);
    if room {
        if !who.is_root() && mine >= share {
            return Admission::Busy(format!(
                "{who} has {mine} connections open, its share ({owners} owners share {pool})"
            ));
        }
        return Admission::Admit;
    }
    let full = if open.len() >= max {
        format!("too many connections (at most {max})")
    } else {
        format!(
            "too many connections (at most {pool} for uids other than root; {reserve} are kept for root)"
        )
    };
    if !who.is_root() && mine >= share {
        return Admission::Busy(full);
    }
    // The largest holder above its share (not root, not the newcomer),
    // and of it the connection idle the longest.
    let mut best: Option<(usize, u64, usize, u32)> = None;
    for (i, c) in open.iter().enumerate() {
        let n = held[&c.owner];
        let Some(since) = c.idle_since else { continue };
        if c.owner == 0 || c.owner == who.owner || n <= share {
            continue;
        }
        let better = match best {
            None => true,
            Some((bn, bsince, ..)) => n > bn || (n == bn && since < bsince),
        };
        if better {
            best = Some((n, since, i, c.owner));
        }
    }
    match best {
        Some((n, _, index, owner)) => Admission::Evict {
            index,
            owner,
            held: n,
            share,
        },
        None => Admission::Busy(full),
    }
}

/// The escalation limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EscalationLimits {
    /// The table all owners but root share.
    pub max: usize,
    /// Most one owner may have pending.
    pub per_owner: usize,
    /// Root's own, outside the table.
    pub root_reserve: usize,
}

/// Whether one more escalation of `who` fits, beside `pending` (by owner).
pub fn escalation_room(
    pending: &BTreeMap<u32, usize>,
    who: &Account,
    limits: &EscalationLimits,
) -> Result<(), String> {
    let mine = pending.get(&who.owner).copied().unwrap_or(0);
    if who.is_root() {
        let reserve = limits.root_reserve.max(1);
        return if mine < reserve {
            Ok(())
        } else {
            Err(format!("root: {mine} of its reserve of {reserve}"))
        };
    }
    let max = limits.max.max(1);
    let others: usize = pending
        .iter()
        .filter(|(o, _)| **o != 0)
        .map(|(_, n)| n)
        .sum();
    let owners =
        pending.iter().filter(|(o, n)| **o != 0 && **n > 0).count() + usize::from(mine == 0);
    // One share is always left for an owner that comes next.
    let share = fair_share(max, owners + 1, limits.per_owner.max(1));
    if mine >= share || others >= max {
        return Err(format!(
            "{who}: {mine} of at most {share} ({owners} owners share {max}); in all: {others} of at most {max}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
