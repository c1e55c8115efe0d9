//! `mpush-conformance`: a black-box kit for implementers of mpush servers
//! and clients. It tests behaviour (what a server does with a second
//! handshake, a retransmit, a stale ticket; what a client does with a
//! duplicate push, a KICK, a refusal), not only bytes: the byte-level
//! vectors are `mpush_protocol::conformance`. Each case names the section of
//! `mpush-wire.md` (or the ADR) it checks; results come as a table, JSON and
//! JUnit XML. See README.md for how to point it at your server or client.

pub mod broken;
pub mod client;
pub mod conn;
pub mod link;
pub mod report;
pub mod server;
pub mod trigger;

pub use report::{CaseResult, Counts, Outcome, Report};
