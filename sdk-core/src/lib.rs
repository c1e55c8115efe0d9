//! The mpush client core used by every SDK: [`session::Session`], the client
//! across reconnects as a sans-IO state machine, and (feature `tokio`) a
//! native driver over TCP and WebSocket.
//!
#![cfg_attr(feature = "tokio", doc = include_str!("../README.md"))]

pub mod session;

pub use session::{
    Action, Message, Session, SessionConfig, SessionError, SessionEvent, SessionState,
};

#[cfg(feature = "tokio")]
pub mod native;
