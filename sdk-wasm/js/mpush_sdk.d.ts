// The types of both modules of the package, one API:
//   - `mpush-sdk`: the transport-secured profile only (ADR 0005), without RSA
//     and AES: `wss://` servers of this project, or `ws://` to a server on
//     this machine whose WebSocket gateway listens on loopback (the default
//     of `cargo run -p mpush-server`);
//   - `mpush-sdk/classic`: the same plus mpush's RSA and AES handshake, for
//     `ws://` servers elsewhere and Java mpush servers.
// Hand-written: the client is sdk-wasm/js/client.js over the wasm core; this
// file is checked by the package's smoke test (tsc --strict on a consumer).

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
  /** `mpush-sdk/classic` only (the default module has no RSA and ignores it): the server's
   *  RSA public key, PEM or base64 X.509, as `mpush-server keygen` prints it. Default: mpush's
   *  published key, which a server with its own key refuses. */
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
  /** `mpush-sdk/classic`: use mpush's published RSA key (the default `publicKey`, or the same
   *  key given by value) on plain `ws://` to another host. Anyone can decrypt such a
   *  handshake; without this, `connect` refuses it with `invalid_input`. Default false. */
  allowPublishedKey?: boolean;
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
  /** The bind token, when the server checks one: a JWT from your backend, signed with
   *  `security.jwt_secret` (HS256) or the key of `security.jwt_public_key` (RS256/ES256),
   *  as `mpush-server token --user ID` mints for tests; or mpush's
   *  `security.bind_secret` form. */
  token?: string;
}

export interface PushOptions {
  /** Wait for the server's ACK (default true): the promise resolves once the
   * server accepted the message (handed it to the backend's sinks), and
   * rejects with `retry_later` (retryable) or `push_rejected`. Until the
   * server answers, the message is kept and sent again after a reconnect. */
  ack?: boolean;
}

/** The browser push client. Create it, set callbacks (or iterate `events()`),
 * `connect()`, `bind()` a user; it reconnects by itself until `close()`. */
export class PushClient {
  /** Checks the options (throws a `PushError` with code `invalid_input` that
   * names the field); nothing connects before `connect()`. */
  constructor(options: PushClientOptions);
  /** Starts connecting (and reconnecting, until `close()`). Resolves once
   * connected; rejects if the client is closed first. */
  connect(): Promise<void>;
  /** Binds a user (and re-binds it after every reconnect). Resolves when the
   * server accepted it; rejects with `bind_failed` if it refused, or a newer
   * bind or an unbind replaced it. */
  bind(userId: string, options?: BindOptions): Promise<void>;
  /** Unbinds the user (no more re-binds); pending `bind()` promises reject.
   * Resolves once the server was told. */
  unbind(): Promise<void>;
  /** Sends a message up to the server (queued while offline). With
   * `{ack: true}` (the default) resolves when the server acknowledged it. */
  push(data: string | Uint8Array | ArrayBuffer, options?: PushOptions): Promise<void>;
  /** Acknowledges a message the app has handled: the message, or its `id`.
   * False when there is nothing to acknowledge (an AUTO message, which the
   * SDK acknowledged already, or one acknowledged before). */
  ack(message: PushMessage | number): boolean;
  /** Closes for good: no more reconnects; pending promises reject. */
  close(): void;
  /** An async iterator over every event from now on:
   * `for await (const e of client.events()) { ... }`. It ends when the client closes. */
  events(): AsyncIterableIterator<PushEvent>;
  readonly state: ConnectionState;
  readonly deviceId: string;
  onMessage: ((message: PushMessage) => void) | null;
  onStateChange: ((state: ConnectionState, detail: StateDetail) => void) | null;
  onKicked: ((info: KickInfo) => void) | null;
  onError: ((error: PushError) => void) | null;
}

/** The SDK's version. */
export function version(): string;

/** What `init` takes: the module's `.wasm` as a URL, a `Response`, its bytes
 * or a compiled `WebAssembly.Module`. Default: the file beside this module. */
export type InitInput = RequestInfo | URL | Response | BufferSource | WebAssembly.Module;

/** Loads the WebAssembly core; call (and await) it once before anything else. */
export default function init(
  module_or_path?: { module_or_path: InitInput | Promise<InitInput> } | InitInput | Promise<InitInput>,
): Promise<unknown>;
