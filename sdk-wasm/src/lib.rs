//! The mpush browser SDK: [`PushClient`], a wasm-bindgen class over
//! `WebSocket` that drives `mpush-sdk-core`'s `Session` (reconnect with
//! backoff and jitter, fast connect, re-bind, dedup, ACKs, the offline queue)
//! and makes no protocol decision of its own. Built into the npm package
//! `mpush-sdk` by `scripts/build-web`; see `sdk-wasm/README.md`.
//!
//! The crate compiles for the host too (so the workspace's lints and tests
//! cover it), but it only does something in a JavaScript engine.

mod client;
mod events;
mod js;
mod options;
mod socket;

use wasm_bindgen::prelude::*;

pub use client::PushClient;
pub use events::EventIterator;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** Where the SDK keeps the resume ticket and the device id: `localStorage` by default. */
export interface TicketStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface BackoffOptions {
  /** First delay before reconnecting (default 1000). */
  initialMs?: number;
  /** Longest delay (default 60000). */
  maxMs?: number;
  /** Growth per failed attempt (default 2). */
  multiplier?: number;
  /** Random part of each delay, 0..1 (default 0.2: ±20 %). */
  jitter?: number;
}

export interface PushClientOptions {
  /** WebSocket gateway URLs (`ws://` or `wss://`), tried in order. */
  servers?: string | string[];
  /** An allocator whose GET answers a comma-separated list of gateway URLs
   *  (the server's `/?transport=ws`); asked before each round of attempts. */
  allocatorUrl?: string;
  /** The server's RSA public key, PEM or base64 X.509. Default: mpush's public default key. */
  publicKey?: string;
  /** Default: a random id made once and kept in `storage`. */
  deviceId?: string;
  /** Default "web" (mpush client type 3). */
  osName?: string;
  osVersion?: string;
  clientVersion?: string;
  /** Offer the v2 profile (AEAD, message ids, resume proofs). Default true; a legacy server ignores it. */
  v2?: boolean;
  /** On `wss://`: use the transport-secured profile (ADR 0005: no RSA or AES on top of
   *  TLS; servers of this project only, falling back to the classic handshake if a server
   *  refuses it). Default true. */
  transportProfile?: boolean;
  /** Heartbeat asked of the server (default 240000). */
  heartbeatMs?: number;
  /** How long one connection attempt may take (default 10000). */
  connectTimeoutMs?: number;
  backoff?: BackoffOptions;
  /** Message ids remembered to drop repeats, across reconnects (default 1024). */
  dedupCapacity?: number;
  /** Up-pushes and ACKs kept while offline (default 256); beyond it they are refused with `queue_full`. */
  outboundCapacity?: number;
  /** Where the resume ticket and device id persist; `null` keeps them in memory only. */
  storage?: TicketStorage | null;
  /** Prefix of the storage keys (default "mpush"). */
  storageKey?: string;
  onMessage?: ((message: PushMessage) => void) | null;
  onStateChange?: ((state: ConnectionState, detail: StateDetail) => void) | null;
  onKicked?: ((info: KickInfo) => void) | null;
  onError?: ((error: PushError) => void) | null;
  /** The WebSocket constructor, for runtimes without a global one (Node 18-21:
   *  `import { WebSocket } from "ws"`). Default: `globalThis.WebSocket`. */
  WebSocket?: new (url: string) => unknown;
}

export type ConnectionState = "idle" | "connecting" | "connected" | "disconnected" | "closed";

export interface StateDetail {
  /** Why the connection ended ("disconnected", "closed"). */
  reason?: string;
  /** When the next attempt starts ("disconnected"). */
  retryInMs?: number;
  /** The gateway ("connecting", "connected"). */
  address?: string;
  /** Fast connect: the session was resumed without a full handshake ("connected"). */
  resumed?: boolean;
  /** The v2 profile is in use ("connected"). */
  v2?: boolean;
}

export interface PushMessage {
  /** This client's handle for the message: pass it to `ack()`. */
  id: number;
  /** The server's message id (v2 servers), as a decimal string; `null` from legacy servers. */
  messageId: string | null;
  traceId: string;
  data: Uint8Array;
  /** `data` as UTF-8 (invalid sequences replaced). */
  text: string;
  /** The server waits for `ack(id)` (BIZ mode); AUTO messages were acknowledged already. */
  needsAck: boolean;
}

export interface KickInfo {
  userId: string;
  deviceId: string;
}

/** The core's codes, the same in every SDK (sdk-core/testdata/error-codes.json). */
export type PushErrorCode =
  | "invalid_input"
  | "invalid_state"
  | "queue_full"
  | "stopped"
  | "bind_failed"
  | "retry_later"
  | "push_rejected"
  | "unknown_ack"
  | "storage"
  | "events_overflow"
  | "callback";

export interface PushError extends Error {
  code: PushErrorCode;
  /** Trying the same again later may work (`retry_later`: the server could not
   * take an up-push now or did not answer in time; `queue_full`). */
  retryable?: boolean;
}

export type PushEvent =
  | { type: "message"; message: PushMessage }
  | { type: "state"; state: ConnectionState; detail: StateDetail }
  | { type: "kicked"; userId: string; deviceId: string }
  | { type: "bound"; userId: string }
  | { type: "error"; error: PushError };

export interface BindOptions {
  /** Tags the server filters broadcasts on: an array or a comma-separated string. */
  tags?: string | string[];
  /** The bind token, when the server checks one (`security.bind_secret`). */
  token?: string;
}

export interface PushOptions {
  /** Wait for the server's ACK (default true): the promise resolves once the
   * server accepted the message (handed it to the backend's sinks), and
   * rejects with `retry_later` (retryable) or `push_rejected`. Until the
   * server answers, the message is kept and sent again after a reconnect. */
  ack?: boolean;
}
"#;

/// Checks one shared protocol test vector (the JSON text of one file of
/// `protocol/testdata/vectors/`) against this build and returns its name;
/// throws an `Error` naming the vector and the field that differs.
#[cfg(feature = "conformance")]
#[wasm_bindgen(js_name = checkVector)]
pub fn check_vector(json: &str) -> Result<String, JsError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| JsError::new(&format!("not JSON: {e}")))?;
    mpush_protocol::conformance::check_vector(&v).map_err(|e| JsError::new(&e))
}

/// One error of every kind, as this SDK raises them (an `Error` with the
/// core's `code` and `retryable`), in the order of
/// `sdk-core/testdata/error-codes.json`, which the tests check them against.
#[doc(hidden)]
pub fn error_table() -> Vec<JsValue> {
    mpush_sdk_core::SessionError::every_kind()
        .iter()
        .map(client::session_error)
        .collect()
}

/// The self-test module's `errorTable()`: see [`error_table`].
#[cfg(feature = "conformance")]
#[wasm_bindgen(js_name = errorTable)]
pub fn error_table_js() -> js_sys::Array {
    error_table().into_iter().collect()
}

/// The SDK's version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// Live WebSocket wrappers and JS closures this module holds, for leak tests.
#[doc(hidden)]
pub fn live_handles() -> (usize, usize) {
    (socket::live_sockets(), js::live_closures())
}
