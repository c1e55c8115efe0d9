//! The mpush wire protocol, once, as sans-IO state machines.
//!
//! Byte-compatible with mpush 0.8.1 clients and servers (the "legacy" profile),
//! plus a negotiated "v2" profile (AEAD, message ids, resume proofs, redirects).
//! Nothing in this crate does IO, reads a clock or draws OS randomness: time
//! comes in as `now` arguments and randomness from a driver-seeded RNG.
//!
#![doc = include_str!("../README.md")]

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod crypto;
pub mod error;
#[cfg(feature = "classic")]
pub mod json_server;
#[cfg(feature = "classic")]
mod liveness;
#[cfg(feature = "classic")]
pub mod machine;
pub mod message;
pub mod packet;
pub mod wire;

pub use error::{CryptoError, DecodeError, FrameError, ProtocolError};
pub use packet::{Command, Decoder, Flags, Frame, Packet};
#[cfg(feature = "classic")]
pub mod ack;
pub mod backoff;
pub mod client;
pub mod dedup;
pub mod seal;
#[cfg(feature = "classic")]
pub mod server;
pub mod session;
pub mod small_map;
#[cfg(feature = "testing")]
pub mod testing;

pub use web_time::Instant;
