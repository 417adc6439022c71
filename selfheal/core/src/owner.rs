//! Whom the helper counts a caller against, and how much each may hold:
//! the real owner of a caller (its user namespace's owner, or the owner of
//! the `/etc/subuid` range its uid is in), the parser of `/etc/subuid`,
//! and the fair-share rules for the helper's limits. Pure: the edge reads
//! the file, the namespace and the passwd database
//! (`selfheal::helper::owner`).
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
mod tests {
    use super::*;

    fn users(name: &str) -> Option<u32> {
        match name {
            "alice" => Some(1000),
            "bob" => Some(1001),
            "root" => Some(0),
            _ => None,
        }
    }

    fn parse(text: &str) -> ParsedSubuids {
        Subuids::parse(text, users)
    }

    #[test]
    fn subuid_lines_are_parsed_and_bad_ones_skipped() {
        let p = parse(
            "# comment\n\nalice:100000:65536\n1001:165536:65536\n  bob : 300000 : 10 \n\
             carol:400000:10\nalice:x:1\nalice:1:2:3\nalice\nalice:500000:0\n\
             alice:4294967290:10\nroot:600000:10\n0:700000:10\nalice:0:10\n:800000:1\n",
        );
        assert_eq!(p.subuids.len(), 3, "{p:?}");
        let lines: Vec<(usize, &str)> = p
            .skipped
            .iter()
            .map(|s| (s.line, s.reason.as_str()))
            .collect();
        assert_eq!(
            lines,
            [
                (6, "no user \"carol\""),
                (7, "start or count is not a number"),
                (8, "not name:start:count"),
                (9, "not name:start:count"),
                (10, "an empty range"),
                (11, "the range runs past the last uid"),
                (
                    12,
                    "owned by root: root's subordinate uids are counted each as its own"
                ),
                (
                    13,
                    "owned by root: root's subordinate uids are counted each as its own"
                ),
                (14, "the range holds uid 0"),
                (15, "no user \"\""),
            ]
        );
        assert_eq!(p.skipped_count, 10);
        assert!(!p.truncated);
        let s = &p.subuids;
        assert_eq!(s.range_of(100000).map(|r| r.owner), Some(1000));
        assert_eq!(s.range_of(165535).map(|r| r.owner), Some(1000));
        assert_eq!(s.range_of(165536).map(|r| r.owner), Some(1001));
        assert_eq!(
            s.range_of(300009).map(|r| (r.owner, r.line)),
            Some((1001, 5))
        );
        for uid in [0, 1, 99999, 231072, 300010, 600000, u32::MAX] {
            assert_eq!(s.range_of(uid), None, "{uid}");
        }
        assert!(
            p.describe()
                .contains("3 subordinate uid ranges; 10 lines skipped")
        );
    }

    #[test]
    fn overlapping_ranges_keep_the_earlier_line() {
        let p = parse("alice:100000:100\nbob:100050:100\nbob:99990:20\nbob:100100:5\n");
        assert_eq!(p.subuids.len(), 2, "{p:?}");
        assert_eq!(p.subuids.range_of(100060).map(|r| r.owner), Some(1000));
        assert_eq!(p.subuids.range_of(99995), None);
        assert_eq!(p.subuids.range_of(100102).map(|r| r.owner), Some(1001));
        let reasons: Vec<(usize, String)> = p
            .skipped
            .iter()
            .map(|s| (s.line, s.reason.clone()))
            .collect();
        assert_eq!(
            reasons,
            [
                (2, "overlaps the range of line 1".to_string()),
                (3, "overlaps the range of line 1".to_string()),
            ]
        );
    }

    #[test]
    fn huge_and_hostile_files_are_bounded() {
        let mut text = String::new();
        for i in 0..(MAX_SUBUID_RANGES + 10) {
            text.push_str(&format!("alice:{}:1\n", 100_000 + i));
        }
        let p = parse(&text);
        assert_eq!(p.subuids.len(), MAX_SUBUID_RANGES);
        assert!(p.truncated);
        assert!(p.describe().contains("ignored"));
        // Names are looked up once each, however many lines name them.
        let mut lookups = 0;
        let p = Subuids::parse(&"zed:100000:1\n".repeat(1000), |_| {
            lookups += 1;
            None
        });
        assert_eq!(lookups, 1);
        assert_eq!(p.skipped_count, 1000);
        assert_eq!(p.skipped.len(), MAX_SKIPPED_KEPT);
        // Garbage, control characters, a NUL, a long name: skipped.
        let long = "x".repeat(10_000);
        let p = parse(&format!(
            "\u{0}\u{7}:::\n{long}:1:1\n::\nalice:-5:3\n\u{fffd}:1:1\n"
        ));
        assert!(p.subuids.is_empty());
        assert_eq!(p.skipped_count, 5);
        assert!(p.skipped.iter().all(|s| s.reason.len() < 80), "{p:?}");
        assert_eq!(parse(""), ParsedSubuids::default());
    }

    #[test]
    fn the_owner_is_the_namespace_owner_or_the_range_owner() {
        let s = parse("alice:100000:65536\nbob:200000:10\n").subuids;
        let unread = Namespace::Unreadable("gone".into());
        let cases: [(u32, Namespace, u32, Basis); 10] = [
            // A plain uid: itself.
            (1000, Namespace::Initial, 1000, Basis::Own),
            (4242, Namespace::Initial, 4242, Basis::Own),
            // A subordinate uid: its range's owner.
            (
                100005,
                Namespace::Initial,
                1000,
                Basis::Subuid {
                    uid: 100005,
                    line: 1,
                },
            ),
            // In a namespace: its owner, whatever uid it runs as.
            (300003, Namespace::OwnedBy(4242), 4242, Basis::Namespace),
            (100005, Namespace::OwnedBy(4242), 4242, Basis::Namespace),
            // A namespace made by a subordinate uid: that range's owner.
            (
                5,
                Namespace::OwnedBy(200001),
                1001,
                Basis::Subuid {
                    uid: 200001,
                    line: 2,
                },
            ),
            // A namespace root made: counted by the caller's own uid.
            (300003, Namespace::OwnedBy(0), 300003, Basis::Own),
            (
                100007,
                Namespace::OwnedBy(0),
                1000,
                Basis::Subuid {
                    uid: 100007,
                    line: 1,
                },
            ),
            // The overflow uid is nobody's namespace.
            (300003, Namespace::OwnedBy(u32::MAX), 300003, Basis::Own),
            // Root is root.
            (0, Namespace::OwnedBy(1000), 0, Basis::Own),
        ];
        for (uid, ns, owner, basis) in cases {
            let a = account(uid, &ns, &s);
            assert_eq!((a.owner, &a.basis), (owner, &basis), "{uid} {ns:?}");
            assert_eq!(a.uid, uid);
            assert_eq!(a.is_root(), owner == 0);
        }
        let a = account(100005, &unread, &s);
        assert_eq!(a.owner, 1000);
        assert_eq!(a.unreadable.as_deref(), Some("gone"));
        assert_eq!(account(77, &unread, &s).owner, 77);
        assert_eq!(
            account(1000, &Namespace::Initial, &s).to_string(),
            "uid 1000"
        );
        assert_eq!(
            account(100005, &Namespace::Initial, &s).to_string(),
            "uid 1000 (the owner of uid 100005's subordinate uid range, line 1)"
        );
        assert_eq!(
            account(300003, &Namespace::OwnedBy(4242), &s).to_string(),
            "uid 4242 (the owner of uid 300003's user namespace)"
        );
        assert!(
            account(5, &Namespace::OwnedBy(200001), &s)
                .to_string()
                .contains("is uid 200001, a subordinate uid of line 2")
        );
    }

    #[test]
    fn fair_shares() {
        for (pool, owners, cap, share) in [
            (48, 1, 16, 16),
            (48, 3, 16, 16),
            (48, 4, 16, 12),
            (48, 5, 16, 9),
            (48, 100, 16, 1),
            (0, 3, 16, 1),
            (48, 0, 16, 16),
            (48, 2, 0, 1),
        ] {
            assert_eq!(
                fair_share(pool, owners, cap),
                share,
                "{pool} {owners} {cap}"
            );
        }
    }

    fn conns(spec: &[(u32, usize, Option<u64>)]) -> Vec<OpenConn> {
        let mut v = Vec::new();
        for &(owner, n, idle) in spec {
            for i in 0..n {
                v.push(OpenConn {
                    owner,
                    idle_since: idle.map(|s| s + i as u64),
                });
            }
        }
        v
    }

    const DEFAULTS: ConnLimits = ConnLimits {
        max: 64,
        per_owner: 16,
        root_reserve: 16,
    };

    #[test]
    fn connections_are_shared_fairly() {
        let me = Account::own(2000);
        let root = Account::own(0);
        // Room: admitted.
        assert_eq!(admit(&[], &me, &DEFAULTS), Admission::Admit);
        // At the per-owner cap.
        let open = conns(&[(2000, 16, Some(0))]);
        let Admission::Busy(m) = admit(&open, &me, &DEFAULTS) else {
            panic!()
        };
        assert_eq!(m, "uid 2000 has 16 connections open (at most 16)");
        // 16 subordinate uids of one owner: one owner, one cap.
        let sub = account(
            100003,
            &Namespace::Initial,
            &parse("alice:100000:65536\n").subuids,
        );
        let open = conns(&[(1000, 16, Some(0))]);
        let Admission::Busy(m) = admit(&open, &sub, &DEFAULTS) else {
            panic!()
        };
        assert!(m.starts_with("uid 1000 (the owner of uid 100003's"), "{m}");
        // Three owners × 16 fill the pool of 48: a fourth owner gets in by
        // closing the oldest idle connection of the largest holder.
        let open = conns(&[
            (3000, 16, Some(100)),
            (3001, 16, Some(50)),
            (3002, 16, Some(200)),
        ]);
        assert_eq!(
            admit(&open, &me, &DEFAULTS),
            Admission::Evict {
                index: 16,
                owner: 3001,
                held: 16,
                share: 12
            }
        );
        // ...but a holder at its share is not taken from for one above.
        let limits = ConnLimits {
            per_owner: 20,
            ..DEFAULTS
        };
        let Admission::Busy(m) = admit(&open, &Account::own(3000), &limits) else {
            panic!()
        };
        assert!(m.contains("at most 48 for uids other than root"), "{m}");
        // Busy connections are never closed; an idle one of a smaller
        // holder still above its share is.
        let open = conns(&[(3000, 17, None), (3001, 14, Some(5)), (3002, 17, None)]);
        let limits = ConnLimits {
            per_owner: 20,
            ..DEFAULTS
        };
        assert_eq!(
            admit(&open, &me, &limits),
            Admission::Evict {
                index: 17,
                owner: 3001,
                held: 14,
                share: 12
            }
        );
        let open = conns(&[(3000, 16, None), (3001, 16, None), (3002, 16, None)]);
        assert!(matches!(admit(&open, &me, &DEFAULTS), Admission::Busy(_)));
        // Root: its reserve, whatever the others hold.
        let open = conns(&[(3000, 16, None), (3001, 16, None), (3002, 16, None)]);
        assert_eq!(admit(&open, &root, &DEFAULTS), Admission::Admit);
        let open = conns(&[
            (3000, 16, None),
            (3001, 16, None),
            (3002, 16, None),
            (0, 15, None),
        ]);
        assert_eq!(admit(&open, &root, &DEFAULTS), Admission::Admit);
        let open = conns(&[
            (3000, 16, None),
            (3001, 16, None),
            (3002, 16, None),
            (0, 16, None),
        ]);
        let Admission::Busy(m) = admit(&open, &root, &DEFAULTS) else {
            panic!()
        };
        assert_eq!(m, "uid 0 has 16 connections open (at most 16)");
        // Within the pool, an owner above its share (others came) waits.
        let limits = ConnLimits {
            per_owner: 24,
            ..DEFAULTS
        };
        let open = conns(&[(3000, 20, Some(0)), (3001, 1, Some(0)), (3002, 1, Some(0))]);
        let Admission::Busy(m) = admit(&open, &Account::own(3000), &limits) else {
            panic!()
        };
        assert!(m.contains("its share (3 owners share 48)"), "{m}");
        assert_eq!(admit(&open, &me, &limits), Admission::Admit);
    }

    #[test]
    fn no_set_of_owners_keeps_another_out() {
        // Owners arrive one by one, each opening as many as it may and
        // holding them idle; every newcomer still gets at least one.
        let mut open: Vec<OpenConn> = Vec::new();
        let mut seq = 0;
        for owner in 1000..1040u32 {
            let who = Account::own(owner);
            let mut got = 0;
            loop {
                match admit(&open, &who, &DEFAULTS) {
                    Admission::Admit => {}
                    Admission::Evict { index, .. } => {
                        open.remove(index);
                    }
                    Admission::Busy(_) => break,
                }
                seq += 1;
                open.push(OpenConn {
                    owner,
                    idle_since: Some(seq),
                });
                got += 1;
            }
            assert!(got >= 1, "owner {owner} was kept out");
            assert!(open.len() <= 48, "{}", open.len());
        }
        // Root still has its reserve.
        assert_eq!(admit(&open, &Account::own(0), &DEFAULTS), Admission::Admit);
    }

    #[test]
    fn tiny_limits_still_admit() {
        let limits = ConnLimits {
            max: 1,
            per_owner: 0,
            root_reserve: 5,
        };
        assert_eq!(admit(&[], &Account::own(7), &limits), Admission::Admit);
        assert_eq!(admit(&[], &Account::own(0), &limits), Admission::Admit);
        let open = conns(&[(7, 1, Some(0))]);
        let Admission::Busy(m) = admit(&open, &Account::own(7), &limits) else {
            panic!()
        };
        assert!(m.contains("at most 1"), "{m}");
        // max 3, 2 per owner, the reserve clamped to 2: root holds 2.
        let limits = ConnLimits {
            max: 3,
            per_owner: 2,
            root_reserve: 16,
        };
        let open = conns(&[(0, 2, Some(0))]);
        assert_eq!(
            admit(&open, &Account::own(65534), &limits),
            Admission::Admit
        );
        let open = conns(&[(0, 2, Some(0)), (65534, 1, Some(9))]);
        let Admission::Busy(m) = admit(&open, &Account::own(65534), &limits) else {
            panic!()
        };
        assert_eq!(m, "too many connections (at most 3)");
    }

    const ESC: EscalationLimits = EscalationLimits {
        max: 1024,
        per_owner: 64,
        root_reserve: 64,
    };

    #[test]
    fn escalations_keep_root_and_a_newcomer_served() {
        let sub = |uid| {
            account(
                uid,
                &Namespace::Initial,
                &parse("alice:100000:65536\n").subuids,
            )
        };
        let mut pending: BTreeMap<u32, usize> = BTreeMap::new();
        // 16 subordinate uids × 64: one owner, 64 in all.
        let mut sent = 0;
        for i in 0..16 {
            for _ in 0..64 {
                if escalation_room(&pending, &sub(100000 + i), &ESC).is_ok() {
                    *pending.entry(1000).or_default() += 1;
                    sent += 1;
                }
            }
        }
        assert_eq!(sent, 64);
        let e = escalation_room(&pending, &sub(100001), &ESC).unwrap_err();
        assert!(e.starts_with("uid 1000 (the owner of uid 100001's"), "{e}");
        assert!(e.contains("64 of at most 64"), "{e}");
        // Root, with the table full of others: its reserve.
        let mut full: BTreeMap<u32, usize> = (2000..2016).map(|o| (o, 64)).collect();
        assert!(escalation_room(&full, &Account::own(0), &ESC).is_ok());
        full.insert(0, 63);
        assert!(escalation_room(&full, &Account::own(0), &ESC).is_ok());
        full.insert(0, 64);
        let e = escalation_room(&full, &Account::own(0), &ESC).unwrap_err();
        assert_eq!(e, "root: 64 of its reserve of 64");
        // Owners arriving one by one, each taking all it may: the table
        // (pending SIGKILLs are never taken back) fills only once 17
        // owners hold their shares.
        let mut pending: BTreeMap<u32, usize> = BTreeMap::new();
        for owner in 3000..3017u32 {
            let who = Account::own(owner);
            let mut got = 0;
            while escalation_room(&pending, &who, &ESC).is_ok() {
                *pending.entry(owner).or_default() += 1;
                got += 1;
            }
            assert!(got >= 1, "owner {owner} was kept out");
            assert!(pending.values().sum::<usize>() <= 1024);
        }
        // A small table: one owner may not take it all.
        let small = EscalationLimits {
            max: 4,
            per_owner: 64,
            root_reserve: 1,
        };
        let mut pending: BTreeMap<u32, usize> = BTreeMap::new();
        while escalation_room(&pending, &Account::own(5), &small).is_ok() {
            *pending.entry(5).or_default() += 1;
        }
        assert_eq!(pending[&5], 2);
        assert!(escalation_room(&pending, &Account::own(6), &small).is_ok());
    }
}
