//! One `WebSocket` and the four closures it calls, owned together: dropping a
//! `Socket` detaches the handlers, closes the socket and frees the closures,
//! so nothing outlives a connection and a late event from an old socket never
//! reaches the session.

use std::cell::Cell;

use js_sys::{Array, ArrayBuffer, Function, Reflect, Uint8Array};
use wasm_bindgen::JsCast;
use wasm_bindgen::closure::Closure;
use web_sys::{BinaryType, CloseEvent, Event, MessageEvent, WebSocket};

use crate::js::{self, Tracked};

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
}

pub fn live_sockets() -> usize {
    LIVE.with(Cell::get)
}

/// What a socket reports to its owner.
pub enum SocketEvent {
    Opened,
    Data(Vec<u8>),
    Closed(String),
}

pub struct Socket {
    ws: WebSocket,
    _on_open: Tracked<dyn FnMut(Event)>,
    _on_message: Tracked<dyn FnMut(MessageEvent)>,
    _on_close: Tracked<dyn FnMut(CloseEvent)>,
    _on_error: Tracked<dyn FnMut(Event)>,
}

impl Socket {
    /// Opens `url` with the app's `WebSocket` constructor (the global one
    /// when `None`); `sink` gets every event of this socket (and only those).
    pub fn open(
        url: &str,
        ctor: Option<&Function>,
        sink: impl Fn(SocketEvent) + Clone + 'static,
    ) -> Result<Self, String> {
        let ws = match ctor {
            // Any object with the WebSocket interface (the `ws` package, undici's).
            Some(c) => Reflect::construct(c, &Array::of1(&url.into())).map(JsCast::unchecked_into),
            None => WebSocket::new(url),
        }
        .map_err(|e| js::describe(&e))?;
        ws.set_binary_type(BinaryType::Arraybuffer);
        let s = sink.clone();
        let on_open = Tracked::new(Closure::<dyn FnMut(Event)>::new(move |_: Event| {
            s(SocketEvent::Opened)
        }));
        let s = sink.clone();
        let on_message = Tracked::new(Closure::<dyn FnMut(MessageEvent)>::new(
            move |e: MessageEvent| {
                // Binary frames only: the binary protocol never uses text.
                if let Ok(buf) = e.data().dyn_into::<ArrayBuffer>() {
                    s(SocketEvent::Data(Uint8Array::new(&buf).to_vec()));
                }
            },
        ));
        let s = sink.clone();
        let on_close = Tracked::new(Closure::<dyn FnMut(CloseEvent)>::new(
            move |e: CloseEvent| {
                let reason = if e.reason().is_empty() {
                    format!("socket closed (code {})", e.code())
                } else {
                    format!("socket closed (code {}: {})", e.code(), e.reason())
                };
                s(SocketEvent::Closed(reason))
            },
        ));
        // An error is always followed by a close event, which carries the news.
        let on_error = Tracked::new(Closure::<dyn FnMut(Event)>::new(|_: Event| {}));
        ws.set_onopen(Some(on_open.function()));
        ws.set_onmessage(Some(on_message.function()));
        ws.set_onclose(Some(on_close.function()));
        ws.set_onerror(Some(on_error.function()));
        LIVE.with(|n| n.set(n.get() + 1));
        Ok(Self {
            ws,
            _on_open: on_open,
            _on_message: on_message,
            _on_close: on_close,
            _on_error: on_error,
        })
    }

    pub fn send(&self, data: &[u8]) -> Result<(), String> {
        self.ws
            .send_with_u8_array(data)
            .map_err(|e| js::describe(&e))
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        self.ws.set_onerror(None);
        let _ = self.ws.close();
        LIVE.with(|n| n.set(n.get().saturating_sub(1)));
    }
}
