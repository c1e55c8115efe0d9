//! Small helpers over the JavaScript host: globals that exist in browsers,
//! workers and Node alike, errors with a `code`, plain objects, and closures
//! that are counted so tests can see none leak.

use std::cell::Cell;

use js_sys::{Function, Object, Reflect, Uint8Array};
use wasm_bindgen::closure::{Closure, WasmClosure};
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout_js(f: &Function, ms: f64) -> JsValue;
    #[wasm_bindgen(js_name = clearTimeout)]
    fn clear_timeout_js(id: &JsValue);
    #[wasm_bindgen(js_namespace = crypto, js_name = getRandomValues, catch)]
    fn get_random_values(buf: &Uint8Array) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(js_name = fetch)]
    fn fetch_js(url: &str, init: &web_sys::RequestInit) -> js_sys::Promise;
}

pub fn set_timeout(f: &Function, ms: f64) -> JsValue {
    set_timeout_js(f, ms)
}

pub fn clear_timeout(id: &JsValue) {
    clear_timeout_js(id);
}

/// 32 bytes from the platform's CSPRNG (`crypto.getRandomValues`).
pub fn random_seed() -> Result<[u8; 32], JsValue> {
    let buf = Uint8Array::new_with_length(32);
    get_random_values(&buf)?;
    let mut out = [0u8; 32];
    buf.copy_to(&mut out);
    Ok(out)
}

pub fn unix_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// `GET url` as text, giving up after `timeout_ms`.
pub async fn fetch_text(url: &str, timeout_ms: u32) -> Result<String, String> {
    let init = web_sys::RequestInit::new();
    // `AbortSignal.timeout` is missing in older engines: no deadline there.
    let has_timeout = get(&js_sys::global(), "AbortSignal")
        .and_then(|a| get(&a, "timeout"))
        .is_some_and(|f| f.is_function());
    if has_timeout {
        init.set_signal(Some(&web_sys::AbortSignal::timeout_with_u32(timeout_ms)));
    }
    let resp = wasm_bindgen_futures::JsFuture::from(fetch_js(url, &init))
        .await
        .map_err(|e| describe(&e))?;
    let resp: web_sys::Response = resp.dyn_into().map_err(|_| "not a Response".to_owned())?;
    if !resp.ok() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let text = resp.text().map_err(|e| describe(&e))?;
    let text = wasm_bindgen_futures::JsFuture::from(text)
        .await
        .map_err(|e| describe(&e))?;
    Ok(text.as_string().unwrap_or_default())
}

/// A readable text for a thrown JS value.
pub fn describe(e: &JsValue) -> String {
    if let Some(err) = e.dyn_ref::<js_sys::Error>() {
        return String::from(err.message());
    }
    e.as_string().unwrap_or_else(|| format!("{e:?}"))
}

/// An `Error` with a `code` property (`PushError` in the TypeScript types).
pub fn error(code: &str, message: &str) -> JsValue {
    let e = js_sys::Error::new(message);
    let _ = Reflect::set(&e, &"code".into(), &code.into());
    e.into()
}

/// A plain object from key/value pairs.
pub fn object(fields: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (k, v) in fields {
        let _ = Reflect::set(&o, &(*k).into(), v);
    }
    o.into()
}

/// `o[key]`, with `undefined` and `null` as `None`.
pub fn get(o: &JsValue, key: &str) -> Option<JsValue> {
    if !o.is_object() {
        return None;
    }
    Reflect::get(o, &key.into())
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

thread_local! {
    static LIVE_CLOSURES: Cell<usize> = const { Cell::new(0) };
}

pub fn live_closures() -> usize {
    LIVE_CLOSURES.with(Cell::get)
}

/// A `Closure` that is counted while alive.
pub struct Tracked<T: ?Sized + WasmClosure>(Closure<T>);

impl<T: ?Sized + WasmClosure> Tracked<T> {
    pub fn new(c: Closure<T>) -> Self {
        LIVE_CLOSURES.with(|n| n.set(n.get() + 1));
        Self(c)
    }

    pub fn function(&self) -> &Function {
        self.0.as_ref().unchecked_ref()
    }
}

impl<T: ?Sized + WasmClosure> Drop for Tracked<T> {
    fn drop(&mut self) {
        LIVE_CLOSURES.with(|n| n.set(n.get().saturating_sub(1)));
    }
}
