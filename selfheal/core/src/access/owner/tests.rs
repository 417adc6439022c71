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
    // Three owners holding 16 each: the pool is full.
    let full = [(3000, 16, None), (3001, 16, None), (3002, 16, None)];
    let open = conns(&full);
    assert!(matches!(admit(&open, &me, &DEFAULTS), Admission::Busy(_)));
    // Root: its reserve, whatever the others hold.
    assert_eq!(admit(&open, &root, &DEFAULTS), Admission::Admit);
    let open = conns(&[&full[..], &[(0, 15, None)]].concat());
    assert_eq!(admit(&open, &root, &DEFAULTS), Admission::Admit);
    let open = conns(&[&full[..], &[(0, 16, None)]].concat());
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
