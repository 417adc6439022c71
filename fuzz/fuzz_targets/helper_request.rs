//! The helper's request parser on any line a client may send. It must never
//! panic, and what it produces must survive the trip the helper and its
//! clients make with it:
//! - an accepted request, written back with `Request::to_line` (what the
//!   client sends), parses to the same request;
//! - a refused one becomes an error response that the client's
//!   `Response::parse` accepts, with the same code and id.

#![no_main]

use libfuzzer_sys::fuzz_target;
use selfheal_core::protocol::{Response, parse_request};

fuzz_target!(|data: &[u8]| {
    match parse_request(data) {
        Ok(request) => {
            let line = request.to_line();
            let again = parse_request(&line);
            assert_eq!(
                again.as_ref(),
                Ok(&request),
                "a request written back by to_line parses differently: {}",
                String::from_utf8_lossy(&line)
            );
        }
        Err(e) => {
            let _ = e.to_string();
            let (id, code) = (e.id, e.code);
            let line = Response::from_error(e).to_line();
            let back = Response::parse(&line).unwrap_or_else(|why| {
                panic!(
                    "the helper's error response is refused by its client ({why}): {}",
                    String::from_utf8_lossy(&line)
                )
            });
            assert_eq!(back.id, id);
            assert_eq!(back.error.map(|w| w.code), Some(code));
        }
    }
});
