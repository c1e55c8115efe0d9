// mpush-sdk's driver: the WebSocket, the timer, promises, callbacks and the
// event iterator around the core (`Core`: sdk-core's Session compiled to
// WebAssembly, sdk-wasm/src/lib.rs). It makes no protocol decision: it reads
// options, does what the core asks (open, send, close, fetch), feeds it what
// happens, and turns the core's items into promises and events, as the
// native driver (sdk-core/src/native.rs) does for Rust.
//
// Every entry point (a method, a socket event, the timer, a fetch) feeds the
// core, runs its items, and only then calls the app's callbacks, so a
// callback may call back into the client.
//
// This file imports nothing: each module of the package (mpush-sdk,
// mpush-sdk/classic) passes its own core to `makeClient`.

// The slots of the two positional values this driver and the core exchange:
// `configure`'s numbers and the items `poll` returns (plain arrays: the least
// glue across the boundary). The core's side is sdk-wasm/src/layout.rs;
// tests/node/smoke.mjs checks every name and position here against the enums
// the self-test module exports from it (NumberSlot::HeartbeatMs is
// NUMBER_SLOT_HEARTBEAT_MS). The bundler turns the names into short ones.
export const NUMBER_SLOT_HEARTBEAT_MS = 0;
export const NUMBER_SLOT_CONNECT_TIMEOUT_MS = 1;
export const NUMBER_SLOT_BACKOFF_INITIAL_MS = 2;
export const NUMBER_SLOT_BACKOFF_MAX_MS = 3;
export const NUMBER_SLOT_BACKOFF_MULTIPLIER = 4;
export const NUMBER_SLOT_BACKOFF_JITTER = 5;
export const NUMBER_SLOT_DEDUP_CAPACITY = 6;
export const NUMBER_SLOT_OUTBOUND_CAPACITY = 7;
export const NUMBER_SLOT_COUNT = 8;
export const ITEM_SLOT_KIND = 0;
export const ITEM_SLOT_VALUE = 1;
export const STATE_SLOT_NAME = 1;
export const STATE_SLOT_ADDRESS = 2;
export const STATE_SLOT_RESUMED = 3;
export const STATE_SLOT_V2 = 4;
export const STATE_SLOT_REASON = 5;
export const STATE_SLOT_RETRY_IN_MS = 6;
export const STATE_SLOT_COUNT = 7;
export const MESSAGE_SLOT_ACK_ID = 1;
export const MESSAGE_SLOT_MESSAGE_ID = 2;
export const MESSAGE_SLOT_TRACE_ID = 3;
export const MESSAGE_SLOT_CONTENT = 4;
export const MESSAGE_SLOT_NEEDS_ACK = 5;
export const MESSAGE_SLOT_COUNT = 6;
export const KICKED_SLOT_USER_ID = 1;
export const KICKED_SLOT_DEVICE_ID = 2;
export const KICKED_SLOT_COUNT = 3;
export const BIND_SLOT_USER_ID = 1;
export const BIND_SLOT_OK = 2;
export const BIND_SLOT_REASON = 3;
export const BIND_SLOT_COUNT = 4;
export const SETTLED_SLOT_REQUEST = 1;
export const SETTLED_SLOT_ERROR = 2;
export const SETTLED_SLOT_COUNT = 3;

/** Events kept for an iterator nobody reads; beyond it the oldest are dropped. */
const QUEUE_CAPACITY = 1024;
/** How long an allocator request may take. */
const ALLOCATOR_TIMEOUT_MS = 5000;

let liveSockets = 0;
let liveHandlers = 0;

/** [open sockets, registered handlers and timers] of every client, for leak tests. */
export function liveHandles() {
  return [liveSockets, liveHandlers];
}

/** `o[key]`, with `null` as `undefined`. */
const get = (o, key) => (o !== null && typeof o === "object" ? o[key] ?? undefined : undefined);

/** A readable text for a thrown value. */
const describe = (e) => (e instanceof Error ? e.message : String(e));

/** Whether `f` can be called. */
const isFn = (f) => typeof f === "function";

/** One WebSocket and its four handlers, detached and closed together. */
class Socket {
  constructor(url, Ctor, sink) {
    const ws = new Ctor(url);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => sink("open");
    ws.onmessage = (e) => {
      // Binary frames only: the binary protocol never uses text.
      if (e.data instanceof ArrayBuffer) sink("data", new Uint8Array(e.data));
    };
    ws.onclose = (e) =>
      sink("close", e.reason ? `socket closed (code ${e.code}: ${e.reason})` : `socket closed (code ${e.code})`);
    // Browsers follow an error with a close event; Node 20's WebSocket does
    // not when the handshake fails (found by the conformance kit's backoff
    // case): the error ends the attempt, and the close that may follow finds
    // the handlers detached.
    ws.onerror = () => sink("close", "socket error");
    this.ws = ws;
    liveSockets++;
    liveHandlers += 4;
  }

  send(bytes) {
    this.ws.send(bytes);
  }

  drop() {
    const ws = this.ws;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    try {
      ws.close();
    } catch {
      // Closing a socket that never opened may throw in some runtimes.
    }
    liveSockets--;
    liveHandlers -= 4;
  }
}

/** The queue behind one `events()` iterator. */
class EventQueue {
  items = [];
  waiters = [];
  done = false;
  overflowed = false;

  /** Hands `event` to a waiting `next()` or queues it; true the first time one was dropped. */
  push(event) {
    if (this.done) return false;
    const w = this.waiters.shift();
    if (w) {
      w({ value: event, done: false });
      return false;
    }
    let first = false;
    if (this.items.length >= QUEUE_CAPACITY) {
      this.items.shift();
      first = !this.overflowed;
      this.overflowed = true;
    }
    this.items.push(event);
    return first;
  }

  /** No more events: pending `next()` calls finish; queued events are still read. */
  end() {
    this.done = true;
    if (this.items.length === 0) {
      for (const w of this.waiters.splice(0)) w({ value: undefined, done: true });
    }
  }

  iterator() {
    return {
      next: () => {
        if (this.items.length) return Promise.resolve({ value: this.items.shift(), done: false });
        if (this.done) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => this.waiters.push(resolve));
      },
      // `break` in `for await` calls it.
      return: () => {
        this.items.length = 0;
        this.end();
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }
}

/**
 * The `PushClient` class over one module's core: `{ Core, version, sdkError }`.
 */
export function makeClient(wasm) {
  const { Core, sdkError } = wasm;
  const invalid = (message) => sdkError("invalid_input", message);

  /** Where the ticket and the device id persist: an object with getItem/setItem/removeItem, or null (memory). */
  function storageCall(storage, method, ...args) {
    if (!storage) return null;
    try {
      return storage[method](...args);
    } catch (e) {
      throw new Error(`storage.${method}: ${describe(e)}`);
    }
  }
  const load = (storage, key) => {
    const v = storageCall(storage, "getItem", key);
    return typeof v === "string" && v !== "" ? v : undefined;
  };
  const save = (storage, key, value) =>
    value === "" ? storageCall(storage, "removeItem", key) : storageCall(storage, "setItem", key, value);

  function randomBytes(n) {
    const c = globalThis.crypto;
    if (!c || !isFn(c.getRandomValues)) throw invalid("this runtime has no crypto.getRandomValues");
    return c.getRandomValues(new Uint8Array(n));
  }

  // ----- options: types here, defaults and ranges in the core ------------

  function parseOptions(o) {
    if (o !== undefined && (o === null || typeof o !== "object")) throw invalid("options must be an object");
    const typed = (key, type, what, from = o) => {
      const v = get(from, key.split(".").pop());
      if (v !== undefined && typeof v !== type) throw invalid(`options.${key} must be ${what}`);
      return v;
    };
    const str = (key) => typed(key, "string", "a string");
    const bool = (key, dflt) => typed(key, "boolean", "a boolean") ?? dflt;
    const fn = (key) => typed(key, "function", "a function") ?? null;
    const num = (key, from = o) => {
      const v = typed(key, "number", "a non-negative number", from);
      if (v === undefined) return NaN;
      if (!Number.isFinite(v) || v < 0) throw invalid(`options.${key} must be a non-negative number`);
      return v;
    };

    let servers = get(o, "servers") ?? [];
    if (typeof servers === "string") servers = [servers];
    else if (!Array.isArray(servers)) throw invalid("options.servers must be a URL or an array of URLs");
    for (const s of servers) {
      if (typeof s !== "string") throw invalid("options.servers must hold strings");
      if (!s.startsWith("ws://") && !s.startsWith("wss://")) {
        throw invalid(`options.servers: "${s}" is not a ws:// or wss:// URL (browsers reach the WebSocket gateway)`);
      }
    }
    let storage = o === undefined ? undefined : o.storage;
    if (storage === undefined) {
      // Reading `localStorage` throws in sandboxed frames and with storage
      // disabled: memory then.
      try {
        storage = globalThis.localStorage ?? null;
      } catch {
        storage = null;
      }
    } else if (storage !== null) {
      if (typeof storage !== "object") throw invalid("options.storage must be a Storage-like object or null");
      for (const m of ["getItem", "setItem", "removeItem"]) {
        if (!isFn(storage[m])) throw invalid(`options.storage.${m} must be a function`);
      }
    }
    const backoff = get(o, "backoff");
    const WebSocketCtor = fn("WebSocket") ?? globalThis.WebSocket;
    if (!isFn(WebSocketCtor)) {
      throw invalid("this runtime has no global WebSocket: pass options.WebSocket (e.g. the `ws` package's) to the constructor");
    }
    const ua = String(get(globalThis.navigator, "userAgent") ?? "");
    return {
      servers,
      allocatorUrl: str("allocatorUrl"),
      publicKey: str("publicKey"),
      deviceId: str("deviceId") || undefined,
      osName: str("osName") ?? "web",
      osVersion: str("osVersion") ?? ua.slice(0, 64),
      clientVersion: str("clientVersion") ?? `mpush-sdk/${wasm.version()}`,
      v2: bool("v2", true),
      // On wss:// the page's TLS already protects the connection: no RSA or
      // AES on top (ADR 0005), falling back if the server refuses.
      transportProfile: bool("transportProfile", true),
      allowPublishedKey: bool("allowPublishedKey", false),
      numbers: [
        [NUMBER_SLOT_HEARTBEAT_MS, num("heartbeatMs")],
        [NUMBER_SLOT_CONNECT_TIMEOUT_MS, num("connectTimeoutMs")],
        [NUMBER_SLOT_BACKOFF_INITIAL_MS, num("backoff.initialMs", backoff)],
        [NUMBER_SLOT_BACKOFF_MAX_MS, num("backoff.maxMs", backoff)],
        [NUMBER_SLOT_BACKOFF_MULTIPLIER, num("backoff.multiplier", backoff)],
        [NUMBER_SLOT_BACKOFF_JITTER, num("backoff.jitter", backoff)],
        [NUMBER_SLOT_DEDUP_CAPACITY, num("dedupCapacity")],
        [NUMBER_SLOT_OUTBOUND_CAPACITY, num("outboundCapacity")],
      ].reduce((n, [slot, v]) => ((n[slot] = v ?? NaN), n), new Float64Array(NUMBER_SLOT_COUNT).fill(NaN)),
      storage,
      storageKey: str("storageKey") ?? "mpush",
      onMessage: fn("onMessage"),
      onStateChange: fn("onStateChange"),
      onKicked: fn("onKicked"),
      onError: fn("onError"),
      WebSocket: WebSocketCtor,
    };
  }

  /**
   * The browser push client. Create it, set callbacks (or iterate
   * `events()`), `connect()`, `bind()` a user; it reconnects by itself until
   * `close()`.
   */
  class PushClient {
    #o;
    #core = new Core();
    #started = false;
    #closed = false;
    #socket = null;
    #socketOpened = false;
    #timer = null;
    #page = null;
    #queues = [];
    /** [request id or "connected", resolve, reject] */
    #waiters = [];
    /** Callbacks to run once the core's items are handled. */
    #calls = [];

    /** Checks the options and prepares the client; nothing connects before `connect()`. */
    constructor(options) {
      const o = (this.#o = parseOptions(options));
      let deviceId = o.deviceId;
      if (!deviceId) {
        const key = `${o.storageKey}.deviceId`;
        let loaded = true;
        try {
          deviceId = load(o.storage, key);
        } catch {
          loaded = false;
        }
        if (!deviceId) {
          deviceId = "web-" + Array.from(randomBytes(16), (b) => b.toString(16).padStart(2, "0")).join("");
          // Best effort: without storage the id lasts this page.
          if (loaded) {
            try {
              save(o.storage, key, deviceId);
            } catch {
              // The id still works; it is just not kept.
            }
          }
        }
      }
      o.deviceId = deviceId;
      this.#core.configure(
        o.servers,
        o.allocatorUrl,
        o.publicKey,
        deviceId,
        o.osName,
        o.osVersion,
        o.clientVersion,
        o.v2,
        o.transportProfile,
        o.allowPublishedKey,
        o.numbers,
      );
    }

    get #ticketKey() {
      return `${this.#o.storageKey}.ticket`;
    }

    /** Starts connecting (and reconnecting, until `close()`). Resolves once connected; rejects if closed first. */
    connect() {
      try {
        this.#start();
      } catch (e) {
        return Promise.reject(e);
      }
      const state = this.state;
      const p =
        state === "connected"
          ? Promise.resolve()
          : state === "closed"
            ? Promise.reject(sdkError("stopped", ""))
            : this.#wait("connected");
      this.#drive();
      return p;
    }

    #start() {
      if (this.#started || this.#closed) return;
      const o = this.#o;
      let ticket;
      try {
        ticket = load(o.storage, this.#ticketKey);
      } catch (e) {
        this.#report(sdkError("storage", describe(e)));
      }
      this.#core.start(ticket, randomBytes(32), Date.now());
      this.#started = true;
      this.#page = this.#listen();
    }

    /** `online` and `visibilitychange` listeners where the host has events (a page, a worker). */
    #listen() {
      const g = globalThis;
      if (!isFn(g.addEventListener)) return null;
      const online = () => this.#feed((c) => c.online());
      const visible = () => {
        if (g.document?.visibilityState === "visible") this.#feed((c) => c.foreground());
      };
      g.addEventListener("online", online);
      const doc = isFn(g.document?.addEventListener) ? g.document : null;
      doc?.addEventListener("visibilitychange", visible);
      liveHandlers += 2;
      return () => {
        g.removeEventListener("online", online);
        doc?.removeEventListener("visibilitychange", visible);
        liveHandlers -= 2;
      };
    }

    /** Runs `f` on the core of a live client, then drives it. */
    #feed(f) {
      if (!this.#started || this.#closed) return;
      f(this.#core);
      this.#drive();
    }

    /** Runs the core's items, re-arms the timer, then the app's callbacks. */
    #drive() {
      if (this.#started) {
        let item;
        while ((item = this.#core.poll())) this.#handle(item);
        this.#arm(this.#closed ? -1 : this.#core.wait());
      }
      const calls = this.#calls.splice(0);
      for (const [f, args] of calls) {
        try {
          f(...args);
        } catch (e) {
          // A throwing callback must not break the client: report it to
          // onError (unless onError itself threw), else to the console.
          const h = this.#o.onError;
          if (h && h !== f) {
            try {
              h(sdkError("callback", describe(e)));
            } catch {
              // onError threw while reporting: nothing more to do.
            }
          } else {
            console.error("mpush-sdk: a callback threw", e);
          }
        }
      }
    }

    #arm(ms) {
      if (this.#timer !== null) {
        clearTimeout(this.#timer);
        this.#timer = null;
        liveHandlers--;
      }
      if (ms >= 0) {
        // +1 ms: a timer must not fire a hair before the deadline it serves.
        this.#timer = setTimeout(() => {
          this.#timer = null;
          liveHandlers--;
          this.#feed((c) => c.timeout());
        }, ms + 1);
        liveHandlers++;
      }
    }

    #handle(item) {
      const a = item[ITEM_SLOT_VALUE];
      switch (item[ITEM_SLOT_KIND]) {
        case "open":
          return this.#open(a);
        case "send":
          try {
            this.#socket?.send(a);
          } catch (err) {
            this.#dropSocket();
            this.#core.closed(`send failed: ${describe(err)}`, true);
          }
          return;
        case "close":
          return this.#dropSocket();
        case "fetch":
          return this.#fetch(a);
        case "state": {
          const name = item[STATE_SLOT_NAME];
          const detail = {};
          for (const [k, slot] of [
            ["address", STATE_SLOT_ADDRESS],
            ["resumed", STATE_SLOT_RESUMED],
            ["v2", STATE_SLOT_V2],
            ["reason", STATE_SLOT_REASON],
            ["retryInMs", STATE_SLOT_RETRY_IN_MS],
          ]) {
            if (item[slot] !== undefined) detail[k] = item[slot];
          }
          this.#callback(this.#o.onStateChange, name, detail);
          this.#emit({ type: "state", state: name, detail });
          if (name === "connected") this.#settle((w) => w === "connected", null);
          return;
        }
        case "message": {
          const data = item[MESSAGE_SLOT_CONTENT];
          const message = {
            id: item[MESSAGE_SLOT_ACK_ID],
            messageId: item[MESSAGE_SLOT_MESSAGE_ID],
            traceId: item[MESSAGE_SLOT_TRACE_ID],
            data,
            text: new TextDecoder().decode(data),
            needsAck: item[MESSAGE_SLOT_NEEDS_ACK],
          };
          this.#callback(this.#o.onMessage, message);
          return this.#emit({ type: "message", message });
        }
        case "kicked": {
          const kicked = { userId: item[KICKED_SLOT_USER_ID], deviceId: item[KICKED_SLOT_DEVICE_ID] };
          this.#callback(this.#o.onKicked, kicked);
          return this.#emit({ type: "kicked", ...kicked });
        }
        case "bind": {
          const user = item[BIND_SLOT_USER_ID];
          if (item[BIND_SLOT_OK]) return this.#emit({ type: "bound", userId: user });
          return this.#report(sdkError("bind_failed", `the server refused to bind ${user}: ${item[BIND_SLOT_REASON]}`));
        }
        case "ticket":
          try {
            save(this.#o.storage, this.#ticketKey, a);
          } catch (err) {
            this.#report(sdkError("storage", describe(err)));
          }
          return;
        case "settled":
          return this.#settle((w) => w === item[SETTLED_SLOT_REQUEST], item[SETTLED_SLOT_ERROR]);
        case "error":
          return this.#report(a);
        case "stopped":
          return this.#shutdown(a);
      }
    }

    #open(url) {
      this.#dropSocket();
      this.#socketOpened = false;
      let socket;
      const sink = (what, data) => {
        if (this.#socket !== socket || this.#closed) return;
        if (what === "open") {
          this.#socketOpened = true;
          this.#core.opened();
        } else if (what === "data") {
          this.#core.input(data);
        } else {
          const wasOpen = this.#socketOpened;
          this.#dropSocket();
          this.#core.closed(data, wasOpen);
        }
        this.#drive();
      };
      try {
        socket = new Socket(url, this.#o.WebSocket, sink);
        this.#socket = socket;
      } catch (err) {
        this.#core.closed(describe(err), false);
      }
    }

    #dropSocket() {
      this.#socket?.drop();
      this.#socket = null;
    }

    async #fetch(url) {
      let text, error;
      try {
        // `AbortSignal.timeout` is missing in older engines: no deadline there.
        const signal = isFn(globalThis.AbortSignal?.timeout) ? AbortSignal.timeout(ALLOCATOR_TIMEOUT_MS) : undefined;
        const r = await fetch(url, { signal });
        if (r.ok) text = await r.text();
        else error = `HTTP ${r.status}`;
      } catch (e) {
        error = describe(e);
      }
      this.#feed((c) => c.servers(text, error));
    }

    #callback(f, ...args) {
      if (f) this.#calls.push([f, args]);
    }

    #wait(what) {
      return new Promise((resolve, reject) => this.#waiters.push([what, resolve, reject]));
    }

    /** Settles the promises `which` picks: resolved, or rejected with `error`. */
    #settle(which, error) {
      this.#waiters = this.#waiters.filter(([w, resolve, reject]) => {
        if (!which(w)) return true;
        if (error) reject(error);
        else resolve();
        return false;
      });
    }

    #report(error) {
      this.#callback(this.#o.onError, error);
      this.#emit({ type: "error", error });
    }

    /** Hands an event to every open iterator. */
    #emit(event) {
      this.#queues = this.#queues.filter((q) => !q.done);
      let overflowed = false;
      for (const q of this.#queues) overflowed = q.push(event) || overflowed;
      if (overflowed) this.#callback(this.#o.onError, sdkError("events_overflow", ""));
    }

    /** Stopped for good: reject what still waits, end the iterators, free the socket, timer and listeners. */
    #shutdown(reason) {
      if (this.#closed) return;
      this.#closed = true;
      if (!this.#started) {
        // Closed before connect(): the core never ran, say it here.
        const item = new Array(STATE_SLOT_COUNT);
        item[ITEM_SLOT_KIND] = "state";
        item[STATE_SLOT_NAME] = "closed";
        item[STATE_SLOT_REASON] = reason;
        this.#handle(item);
      }
      this.#settle(() => true, sdkError("stopped", ""));
      for (const q of this.#queues.splice(0)) q.end();
      this.#dropSocket();
      this.#arm(-1);
      this.#page?.();
      this.#page = null;
    }

    /** Runs a core command; before `connect()` it is `invalid_state`, after `close()` `stopped`. */
    #command(f) {
      if (!this.#started) throw sdkError(this.#closed ? "stopped" : "invalid_state", "");
      return f(this.#core);
    }

    /** Runs a command that returns a request id; the promise settles with it. */
    #request(f) {
      let id;
      try {
        id = this.#command(f);
      } catch (e) {
        return Promise.reject(e);
      }
      const p = this.#wait(id);
      // The core may have settled it already (an unbind, offline).
      this.#drive();
      return p;
    }

    /**
     * Binds a user (and re-binds it after every reconnect). Resolves when the
     * server accepted it; rejects with `bind_failed` if it refused, or a newer
     * bind or an unbind replaced it.
     */
    bind(userId, options) {
      let tags = get(options, "tags") ?? "";
      const token = get(options, "token") ?? "";
      if (Array.isArray(tags)) {
        if (!tags.every((t) => typeof t === "string")) return Promise.reject(invalid("options.tags must hold strings"));
        tags = tags.join(",");
      } else if (typeof tags !== "string") {
        return Promise.reject(invalid("options.tags must be a string or an array"));
      }
      if (typeof token !== "string") return Promise.reject(invalid("options.token must be a string"));
      return this.#request((c) => c.bind(String(userId), tags, token));
    }

    /** Unbinds the user (no more re-binds); pending `bind()` promises reject. Resolves once the server was told. */
    unbind() {
      return this.#request((c) => c.unbind());
    }

    /**
     * Acknowledges a message the app has handled: the message, or its `id`.
     * False when there is nothing to acknowledge (an AUTO message, which the
     * SDK acknowledged already, or one acknowledged before).
     */
    ack(message) {
      const id = typeof message === "number" ? message : get(message, "id");
      if (typeof id !== "number") throw invalid("ack() takes a message or its id");
      if (!Number.isInteger(id) || id < 0) return false;
      const r = this.#command((c) => c.ack(id));
      this.#drive();
      return r;
    }

    /** Sends a message up to the server (queued while offline). With `{ack: true}` (the default) resolves when the server acknowledged it. */
    push(data, options) {
      let bytes;
      if (typeof data === "string") bytes = new TextEncoder().encode(data);
      else if (data instanceof Uint8Array) bytes = data;
      else if (data instanceof ArrayBuffer) bytes = new Uint8Array(data);
      else return Promise.reject(invalid("data must be a string, a Uint8Array or an ArrayBuffer"));
      const ack = get(options, "ack") ?? true;
      if (typeof ack !== "boolean") return Promise.reject(invalid("options.ack must be a boolean"));
      return this.#request((c) => c.push(bytes, ack));
    }

    /** Closes for good: no more reconnects; pending promises reject. */
    close() {
      if (this.#started) {
        this.#core.close();
      } else {
        this.#shutdown("closed by the app");
      }
      this.#drive();
    }

    /** An async iterator over every event from now on; it ends when the client closes. */
    events() {
      const q = new EventQueue();
      if (this.#closed) q.end();
      else this.#queues.push(q);
      return q.iterator();
    }

    get state() {
      if (this.#started) return this.#core.state();
      return this.#closed ? "closed" : "idle";
    }

    get deviceId() {
      return this.#o.deviceId;
    }

    get onMessage() {
      return this.#o.onMessage;
    }
    set onMessage(f) {
      this.#o.onMessage = f ?? null;
    }
    get onStateChange() {
      return this.#o.onStateChange;
    }
    set onStateChange(f) {
      this.#o.onStateChange = f ?? null;
    }
    get onKicked() {
      return this.#o.onKicked;
    }
    set onKicked(f) {
      this.#o.onKicked = f ?? null;
    }
    get onError() {
      return this.#o.onError;
    }
    set onError(f) {
      this.#o.onError = f ?? null;
    }
  }
  return PushClient;
}
