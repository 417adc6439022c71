//! A socket action names the socket, not only its fd.
//!
//! Between a judgement and the act, the agent may drop its dead connection
//! and reconnect; the new connection usually gets the same fd number. An
//! act that named only the fd then destroyed the agent's healthy new
//! connection. Through a real `selfheal helper`, every socket action now
//! carries the judged socket's inode, the helper compares it with the
//! duplicate it took through `pidfd_getfd`, and refuses on a mismatch: the
//! new connection is untouched. A socket action without an inode is a bad
//! request. Needs root (the helper); skips otherwise.

use std::{
    io::{Read as _, Write as _},
    path::Path,
    process::Command,
    time::Duration,
};

use selfheal::{helper::HelperClient, sys::pidfd::start_ticks};
use selfheal_core::protocol::ActRequest;
use selfheal_core::protocol::Action;
use selfheal_core::protocol::ErrorCode;
use tests::fixtures::{Reaped, quiet_helper};
use tests::{Peer, Scratch, need_root, patient_client_opts, socket_fd_of};

const SEC: Duration = Duration::from_secs(1);

fn start_helper(path: &Path) -> Reaped {
    let h = Reaped(quiet_helper(path));
    tests::fixtures::wait_answering(path);
    h
}

fn act(action: Action, pid: u32, fd: i32, inode: Option<u64>) -> ActRequest {
    let mut r = ActRequest::new(action, pid, start_ticks(pid).expect("running"));
    r.fd = Some(fd);
    r.inode = inode;
    r.agent = Some("runner".into());
    r
}

#[test]
fn a_socket_act_on_a_reconnected_fd_is_refused_and_the_new_connection_lives() {
    let _area = tests::area(module_path!());
    if !need_root("fd_reuse") {
        return;
    }
    let dir = Scratch::new("fd-reuse");
    let sock = dir.join("helper.sock");
    let _helper = start_helper(&sock);
    let l = tests::listener();
    let addr = l.local_addr().unwrap().to_string();

    // The agent's first connection: the one a check judged dead.
    let mut cmd = Command::new(tests::helper_bin("recv-peer"));
    cmd.args(["reconnecting", &addr]);
    let agent = Peer::spawn(cmd);
    let old = agent.ready();
    let fd = socket_fd_of(old.pid, old.inode).expect("the first socket's fd");
    let (first, _) = l.accept().expect("accept the first connection");

    // It reconnects before the act: the new socket takes the same fd.
    drop(first);
    agent.expect("eof", 10 * SEC);
    let new = agent.ready();
    let (mut second, _) = l.accept().expect("accept the second connection");
    assert_ne!(new.inode, old.inode);
    // recv-peer reconnects in place (dup2 onto the first fd if need be):
    // the condition this test is for, made every time, never left to luck.
    let new_fd = socket_fd_of(new.pid, new.inode).expect("the second socket's fd");
    assert_eq!(new_fd, fd, "the new connection does not hold the judged fd");

    let mut client = HelperClient::connect_with(&sock, patient_client_opts()).expect("connect");
    for action in [Action::DestroySocket, Action::ArmKeepalive] {
        let e = client
            .act(&act(action, new.pid, fd, Some(old.inode)))
            .expect_err("the act names the old socket");
        let text = e.to_string();
        // It names the judged socket, never the one found (the target's,
        // not the caller's to learn).
        assert!(
            text.contains(&old.inode.to_string())
                && text.contains("no longer holds the judged socket")
                && !text.contains(&new.inode.to_string()),
            "{action}: the refusal names the judged socket only: {text}"
        );
        // Without the socket's identity, no socket act at all.
        let e = client
            .act(&act(action, new.pid, fd, None))
            .expect_err("an act without an inode");
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{action}: {e}");
        assert!(e.to_string().contains("missing field `inode`"), "{e}");
    }

    // The new connection is untouched: data still flows to the agent.
    second
        .write_all(b"hello")
        .expect("send on the new connection");
    agent.expect("got 5", 10 * SEC);
    assert_eq!(socket_fd_of(new.pid, new.inode), Some(fd));

    // Naming the socket it holds now, the act goes through.
    let done = client
        .act(&act(Action::ArmKeepalive, new.pid, fd, Some(new.inode)))
        .expect("arm keepalive on the socket the fd holds");
    assert!(done.is_object(), "{done}");
    let mut buf = [0u8; 1];
    second
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    // The agent never writes: a timeout, not an EOF, so it is connected.
    assert!(second.read(&mut buf).is_err(), "the agent still holds it");
}
