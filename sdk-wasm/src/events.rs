//! The async iterator of events (`for await (const e of client.events())`):
//! each iterator has its own bounded queue, fed only while it is open.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use js_sys::{Function, Promise};
use wasm_bindgen::prelude::*;

use crate::js;

/// Events kept for an iterator nobody reads; beyond it the oldest are
/// dropped and `events_overflow` is reported once.
pub const QUEUE_CAPACITY: usize = 1024;

#[derive(Default)]
pub struct EventQueue {
    items: VecDeque<JsValue>,
    waiters: VecDeque<Function>,
    done: bool,
    overflowed: bool,
}

fn result(value: JsValue, done: bool) -> JsValue {
    js::object(&[("value", value), ("done", done.into())])
}

impl EventQueue {
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Hands `event` to a waiting `next()` or queues it. True the first time
    /// an old event had to be dropped.
    pub fn push(&mut self, event: JsValue) -> bool {
        if self.done {
            return false;
        }
        // Resolving runs no user code now (promise reactions are microtasks).
        if let Some(resolve) = self.waiters.pop_front() {
            let _ = resolve.call1(&JsValue::NULL, &result(event, false));
            return false;
        }
        let mut first_overflow = false;
        if self.items.len() >= QUEUE_CAPACITY {
            self.items.pop_front();
            first_overflow = !self.overflowed;
            self.overflowed = true;
        }
        self.items.push_back(event);
        first_overflow
    }

    /// No more events: pending `next()` calls finish; queued events are still read.
    pub fn end(&mut self) {
        self.done = true;
        if self.items.is_empty() {
            for w in self.waiters.drain(..) {
                let _ = w.call1(&JsValue::NULL, &result(JsValue::UNDEFINED, true));
            }
        }
    }

    fn next(&mut self) -> Promise {
        if let Some(e) = self.items.pop_front() {
            return Promise::resolve(&result(e, false));
        }
        if self.done {
            return Promise::resolve(&result(JsValue::UNDEFINED, true));
        }
        let mut resolver = None;
        let p = Promise::new(&mut |resolve, _| resolver = Some(resolve));
        if let Some(r) = resolver {
            self.waiters.push_back(r);
        }
        p
    }
}

#[wasm_bindgen(
    inline_js = "export function asyncIterable(o) { o[Symbol.asyncIterator] = function () { return this; }; return o; }"
)]
extern "C" {
    #[wasm_bindgen(js_name = asyncIterable)]
    fn async_iterable(o: JsValue) -> JsValue;
}

/// An async iterator of `PushEvent`s; get one from `PushClient.events()`.
#[wasm_bindgen]
pub struct EventIterator {
    queue: Rc<RefCell<EventQueue>>,
}

impl EventIterator {
    /// A JS iterator object (with `Symbol.asyncIterator`) over `queue`.
    pub fn create(queue: Rc<RefCell<EventQueue>>) -> JsValue {
        async_iterable(Self { queue }.into())
    }
}

#[wasm_bindgen]
impl EventIterator {
    #[wasm_bindgen(unchecked_return_type = "Promise<IteratorResult<PushEvent, undefined>>")]
    pub fn next(&self) -> Promise {
        self.queue.borrow_mut().next()
    }

    /// Stops this iterator (`break` in `for await` calls it).
    #[wasm_bindgen(
        js_name = "return",
        unchecked_return_type = "Promise<IteratorResult<PushEvent, undefined>>"
    )]
    pub fn finish(&self) -> Promise {
        let mut q = self.queue.borrow_mut();
        q.items.clear();
        q.end();
        Promise::resolve(&result(JsValue::UNDEFINED, true))
    }
}
