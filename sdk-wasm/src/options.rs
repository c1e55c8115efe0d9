//! `PushClientOptions` (a plain JS object) read once, in the constructor:
//! a field of the wrong type is an `invalid_input` error that names it.
//! Defaults and ranges are the core's (`SessionConfig::new`, `validate`).

use std::time::Duration;

use js_sys::{Array, Function, Reflect};
use std::sync::Arc;

use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::DeviceInfo;
use mpush_sdk_core::SessionConfig;
use wasm_bindgen::prelude::*;

use crate::js;

/// Where the ticket and the device id persist.
#[derive(Clone)]
pub enum Storage {
    /// In memory only.
    Memory,
    /// An object with `getItem`, `setItem`, `removeItem` (`localStorage` by default).
    Js(JsValue),
}

impl Storage {
    pub fn load(&self, key: &str) -> Result<Option<String>, String> {
        let Self::Js(o) = self else { return Ok(None) };
        let v = call(o, "getItem", &[key.into()])?;
        Ok(v.as_string().filter(|s| !s.is_empty()))
    }

    /// Saves `value`; empty removes the key.
    pub fn save(&self, key: &str, value: &str) -> Result<(), String> {
        let Self::Js(o) = self else { return Ok(()) };
        if value.is_empty() {
            call(o, "removeItem", &[key.into()])
        } else {
            call(o, "setItem", &[key.into(), value.into()])
        }
        .map(|_| ())
    }
}

fn call(o: &JsValue, method: &str, args: &[JsValue]) -> Result<JsValue, String> {
    let f: Function = Reflect::get(o, &method.into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| format!("storage.{method} is not a function"))?;
    let r = match args {
        [a] => f.call1(o, a),
        [a, b] => f.call2(o, a, b),
        _ => f.call0(o),
    };
    r.map_err(|e| format!("storage.{method}: {}", js::describe(&e)))
}

pub struct Options {
    /// Everything the session needs; the device id is filled in by the
    /// client (from `deviceId`, or the one kept in `storage`).
    pub session: SessionConfig,
    pub device_id: Option<String>,
    pub storage: Storage,
    pub storage_key: String,
    pub on_message: Option<Function>,
    pub on_state_change: Option<Function>,
    pub on_kicked: Option<Function>,
    pub on_error: Option<Function>,
    /// The `WebSocket` constructor to use (`None`: the global one).
    pub websocket: Option<Function>,
}

type Invalid = String;

fn string(o: &JsValue, key: &str) -> Result<Option<String>, Invalid> {
    match js::get(o, key) {
        None => Ok(None),
        Some(v) => v
            .as_string()
            .map(Some)
            .ok_or_else(|| format!("options.{key} must be a string")),
    }
}

fn boolean(o: &JsValue, key: &str, default: bool) -> Result<bool, Invalid> {
    match js::get(o, key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| format!("options.{key} must be a boolean")),
    }
}

/// A finite, non-negative number; its range is the core's to check.
fn number(o: &JsValue, key: &str) -> Result<Option<f64>, Invalid> {
    let Some(v) = js::get(o, key.rsplit('.').next().unwrap_or(key)) else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(Some(n)),
        _ => Err(format!("options.{key} must be a non-negative number")),
    }
}

fn millis(o: &JsValue, key: &str, into: &mut Duration) -> Result<(), Invalid> {
    if let Some(n) = number(o, key)? {
        *into = Duration::from_millis(n as u64);
    }
    Ok(())
}

fn callback(o: &JsValue, key: &str) -> Result<Option<Function>, Invalid> {
    match js::get(o, key) {
        None => Ok(None),
        Some(v) => v
            .dyn_into::<Function>()
            .map(Some)
            .map_err(|_| format!("options.{key} must be a function")),
    }
}

fn default_storage() -> Storage {
    // Reading `localStorage` throws in sandboxed frames and with storage
    // disabled: fall back to memory then.
    match Reflect::get(&js_sys::global(), &"localStorage".into()) {
        Ok(v) if v.is_object() => Storage::Js(v),
        _ => Storage::Memory,
    }
}

fn user_agent() -> String {
    let nav = Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or(JsValue::UNDEFINED);
    let ua = js::get(&nav, "userAgent")
        .and_then(|v| v.as_string())
        .unwrap_or_default();
    ua.chars().take(64).collect()
}

impl Options {
    pub fn parse(o: &JsValue) -> Result<Self, Invalid> {
        if !o.is_undefined() && !o.is_object() {
            return Err("options must be an object".into());
        }
        let servers = match js::get(o, "servers") {
            None => Vec::new(),
            Some(v) if v.is_string() => v.as_string().into_iter().collect(),
            Some(v) if Array::is_array(&v) => Array::from(&v)
                .iter()
                .map(|s| {
                    s.as_string()
                        .ok_or_else(|| "options.servers must hold strings".to_owned())
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("options.servers must be a URL or an array of URLs".into()),
        };
        for s in &servers {
            if !(s.starts_with("ws://") || s.starts_with("wss://")) {
                return Err(format!(
                    "options.servers: {s:?} is not a ws:// or wss:// URL (browsers reach the WebSocket gateway)"
                ));
            }
        }
        #[cfg(not(feature = "classic"))]
        if let Some(s) = servers.iter().find(|s| !s.starts_with("wss://")) {
            return Err(format!(
                "options.servers: {s:?}: this module (mpush-sdk/tls) speaks only wss://; use the mpush-sdk module for ws://"
            ));
        }
        let allocator_url = string(o, "allocatorUrl")?;
        let storage = match Reflect::get(o, &"storage".into()) {
            Ok(v) if v.is_undefined() => default_storage(),
            Ok(v) if v.is_null() => Storage::Memory,
            Ok(v) if v.is_object() => {
                for m in ["getItem", "setItem", "removeItem"] {
                    if !js::get(&v, m).is_some_and(|f| f.is_function()) {
                        return Err(format!("options.storage.{m} must be a function"));
                    }
                }
                Storage::Js(v)
            }
            _ => return Err("options.storage must be a Storage-like object or null".into()),
        };
        let public_key = match string(o, "publicKey")? {
            Some(text) => {
                RsaPublic::from_text(&text).map_err(|e| format!("options.publicKey: {e}"))?
            }
            None => RsaPublic::mpush_default(),
        };
        let device = DeviceInfo {
            device_id: String::new(),
            os_name: string(o, "osName")?.unwrap_or_else(|| "web".into()),
            os_version: string(o, "osVersion")?.unwrap_or_else(user_agent),
            client_version: string(o, "clientVersion")?
                .unwrap_or_else(|| format!("mpush-sdk/{}", env!("CARGO_PKG_VERSION"))),
        };
        let mut session = SessionConfig::new(servers, Arc::new(public_key), device);
        session.allocator_url = allocator_url;
        session.offer_v2 = boolean(o, "v2", true)?;
        // On wss:// the page's TLS already protects the connection: skip RSA
        // and AES (ADR 0005), falling back if the server refuses.
        session.transport_profile = boolean(o, "transportProfile", true)?;
        millis(o, "heartbeatMs", &mut session.heartbeat)?;
        millis(o, "connectTimeoutMs", &mut session.connect_timeout)?;
        if let Some(b) = js::get(o, "backoff") {
            let backoff = &mut session.backoff;
            millis(&b, "backoff.initialMs", &mut backoff.initial)?;
            millis(&b, "backoff.maxMs", &mut backoff.max)?;
            if let Some(n) = number(&b, "backoff.multiplier")? {
                backoff.multiplier = n;
            }
            if let Some(n) = number(&b, "backoff.jitter")? {
                backoff.jitter = n;
            }
        }
        for (key, into) in [
            ("dedupCapacity", &mut session.dedup_capacity),
            ("outboundCapacity", &mut session.outbound_capacity),
        ] {
            if let Some(n) = number(o, key)? {
                *into = n as usize;
            }
        }
        Ok(Self {
            session,
            device_id: string(o, "deviceId")?.filter(|s| !s.is_empty()),
            storage,
            storage_key: string(o, "storageKey")?.unwrap_or_else(|| "mpush".into()),
            on_message: callback(o, "onMessage")?,
            on_state_change: callback(o, "onStateChange")?,
            on_kicked: callback(o, "onKicked")?,
            on_error: callback(o, "onError")?,
            websocket: match callback(o, "WebSocket")? {
                Some(c) => Some(c),
                None if js::get(&js_sys::global(), "WebSocket").is_some() => None,
                None => {
                    return Err(
                        "this runtime has no global WebSocket: pass options.WebSocket \
                                (e.g. the `ws` package's) to the constructor"
                            .into(),
                    );
                }
            },
        })
    }
}
