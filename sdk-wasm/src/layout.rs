//! The layout of the two positional values that cross between the core and
//! the JavaScript driver (`js/client.js`): `configure`'s `numbers` and the
//! items `poll` returns. They stay plain arrays (a typed array and a short
//! array of values cross the boundary with the least glue, and the browser
//! package has a size budget), but no side writes a bare position: both name
//! each slot. The driver's names are in `js/layout.js`; the self-test module
//! (`mpush-sdk/conformance`) exports these enums, and the Node test
//! (`tests/node/smoke.mjs`) fails when the two disagree.

#[cfg(feature = "conformance")]
use wasm_bindgen::prelude::wasm_bindgen;

/// `configure`'s `numbers` (a `Float64Array`; NaN takes the default).
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumberSlot {
    HeartbeatMs = 0,
    ConnectTimeoutMs = 1,
    BackoffInitialMs = 2,
    BackoffMaxMs = 3,
    BackoffMultiplier = 4,
    BackoffJitter = 5,
    DedupCapacity = 6,
    OutboundCapacity = 7,
    /// How many there are.
    Count = 8,
}

/// Every `poll` item: slot 0 names it (`open`, `send`, `close`, `fetch`,
/// `state`, `message`, `kicked`, `bind`, `ticket`, `settled`, `error`,
/// `stopped`); the items of one value (`open` address, `send` bytes,
/// `fetch` url, `ticket`, `error`, `stopped` reason) have it in slot 1.
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemSlot {
    Kind = 0,
    Value = 1,
}

/// A `state` item; what the state does not carry is `undefined`.
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateSlot {
    Name = 1,
    Address = 2,
    Resumed = 3,
    V2 = 4,
    Reason = 5,
    RetryInMs = 6,
    Count = 7,
}

/// A `message` item.
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageSlot {
    AckId = 1,
    /// A decimal string (a u64 does not fit a JavaScript number), or null.
    MessageId = 2,
    TraceId = 3,
    Content = 4,
    NeedsAck = 5,
    Count = 6,
}

/// A `kicked` item.
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KickedSlot {
    UserId = 1,
    DeviceId = 2,
    Count = 3,
}

/// A `bind` item.
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindSlot {
    UserId = 1,
    Ok = 2,
    Reason = 3,
    Count = 4,
}

/// A `settled` item: the request, and its error (null when it succeeded).
#[cfg_attr(feature = "conformance", wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettledSlot {
    Request = 1,
    Error = 2,
    Count = 3,
}
