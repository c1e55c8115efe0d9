// The demo page: the packed mpush-sdk package against the server that serves
// this page. Query parameters (for tests and tinkering): ?ws=<gateway URL>,
// ?backoffMs=<first reconnect delay>, ?user=<bind this user at once>,
// ?sdk=default|classic (which module of the package).
//
// The package's default module has no RSA or AES (ADR 0005): it needs wss://,
// or ws:// to a server on this machine (a WebSocket gateway on loopback counts
// as secure: the server's defaults). So a page served over https://, or from
// this machine, loads it; a page served over plain http from another host
// uses `mpush-sdk/classic`, which does mpush's RSA and AES handshake.
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const local = ["127.0.0.1", "localhost", "[::1]"].includes(location.hostname);
const module = params.get("sdk") ?? (location.protocol === "https:" || local ? "default" : "classic");

let sdk;
try {
  sdk = await import(module === "classic" ? "mpush-sdk/classic" : "mpush-sdk");
  document.body.dataset.sdk = module;
  await sdk.default();
} catch (e) {
  $("missing").hidden = false;
  console.error("mpush-sdk failed to load", e);
  throw e;
}

let client = null;

function setState(state, detail = {}) {
  const el = $("state");
  el.textContent = state;
  el.dataset.state = state;
  const parts = [];
  if (detail.address) parts.push(detail.address);
  if (detail.v2 !== undefined) parts.push(detail.v2 ? "v2" : "legacy");
  if (detail.resumed) parts.push("resumed");
  if (detail.retryInMs !== undefined) parts.push(`retry in ${detail.retryInMs} ms`);
  if (detail.reason) parts.push(detail.reason);
  $("detail").textContent = parts.join(" · ");
}

function ackLabel(li, ack) {
  const badge = li.querySelector(".ack");
  badge.dataset.ack = ack;
  badge.textContent = { auto: "acked by the SDK", waiting: "waiting for the app's ACK", acked: "acked by the app", none: "no ACK" }[ack];
}

function showMessage(m) {
  const li = document.createElement("li");
  li.dataset.text = m.text;
  li.dataset.messageId = m.messageId ?? "";
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = m.text;
  const time = document.createElement("time");
  time.textContent = new Date().toLocaleTimeString();
  const badge = document.createElement("span");
  badge.className = "ack";
  li.append(text, badge, time);
  if (m.needsAck) {
    ackLabel(li, "waiting");
    const button = document.createElement("button");
    button.textContent = "Ack";
    button.className = "ack-button";
    button.onclick = () => {
      client?.ack(m);
      ackLabel(li, "acked");
      button.remove();
    };
    li.append(button);
  } else {
    ackLabel(li, "auto");
  }
  $("messages").prepend(li);
}

function connect() {
  client?.close();
  const server = $("server").value.trim();
  const backoffMs = Number(params.get("backoffMs") ?? 1000);
  client = new sdk.PushClient({
    ...(server ? { servers: [server] } : { allocatorUrl: `${location.origin}/?transport=ws` }),
    backoff: { initialMs: backoffMs, maxMs: Math.max(backoffMs * 2, 10000) },
    onMessage: showMessage,
    onStateChange: setState,
    onKicked: (k) => setState("kicked", { reason: `user ${k.userId} was kicked` }),
    onError: (e) => ($("push-result").textContent = `SDK error (${e.code}): ${e.message}`),
  });
  $("device").textContent = client.deviceId;
  $("disconnect").disabled = false;
  client.connect().catch(() => {});
  return client;
}

$("bind-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const c = connect();
  const tags = $("tags").value.split(",").map((t) => t.trim()).filter(Boolean);
  try {
    await c.bind($("user").value.trim(), { tags });
    document.body.dataset.bound = $("user").value.trim();
  } catch (err) {
    $("push-result").textContent = `bind failed: ${err.message}`;
  }
});

$("disconnect").addEventListener("click", () => {
  client?.close();
  client = null;
  $("disconnect").disabled = true;
  delete document.body.dataset.bound;
});

$("push-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = {
    userId: $("push-user").value.trim(),
    content: $("push-content").value,
    ackMode: $("push-ack").value,
  };
  const ttl = Number($("push-ttl").value);
  if (ttl > 0) body.ttlSeconds = ttl;
  const headers = { "content-type": "application/json" };
  const token = $("push-token").value.trim();
  if (token) headers.authorization = `Bearer ${token}`;
  const out = $("push-result");
  try {
    const r = await fetch("/api/v1/push", { method: "POST", headers, body: JSON.stringify(body) });
    const j = await r.json();
    out.textContent = r.ok
      ? `sent: trace ${j.traceId}, ${j.dispatched} device(s) online${j.stored ? ", kept for offline delivery" : ""}`
      : `refused (${r.status}): ${j.error?.message ?? JSON.stringify(j)}`;
    out.dataset.traceId = j.traceId ?? "";
    if (r.ok) followTrace(j.traceId, headers);
  } catch (err) {
    out.textContent = `the API did not answer: ${err.message}`;
  }
});

// A push's trace, live: each recipient's states as the server records them
// (ACCEPTED, DISPATCHED, DELIVERED, then ACK, TIMEOUT, OFFLINE or FAILED).
let following = 0;
const FINAL = ["ACK", "TIMEOUT", "OFFLINE", "FAILED"];
async function followTrace(traceId, headers) {
  const run = ++following;
  const list = $("trace");
  list.hidden = false;
  list.replaceChildren();
  list.dataset.traceId = traceId;
  const shown = new Set();
  const deadline = Date.now() + 60000;
  while (run === following && Date.now() < deadline) {
    try {
      // Bounded: a request that never answers must not stop the following.
      const r = await fetch(`/api/v1/traces/${encodeURIComponent(traceId)}`, {
        headers,
        signal: AbortSignal.timeout(3000),
      });
      if (r.ok) {
        const t = await r.json();
        for (const rec of t.recipients ?? []) {
          for (const [state, at, detail] of rec.history ?? []) {
            const key = `${rec.deviceId}|${state}|${at}`;
            if (shown.has(key)) continue;
            shown.add(key);
            const li = document.createElement("li");
            li.dataset.state = state;
            li.textContent = `${new Date(at).toLocaleTimeString()} ${state}${rec.deviceId ? ` · ${rec.deviceId}` : ""}${detail ? ` · ${detail}` : ""}`;
            list.append(li);
          }
        }
        const states = (t.recipients ?? []).map((rec) => rec.state);
        list.dataset.state = states.join(",");
        if (states.length > 0 && states.every((s) => FINAL.includes(s))) return;
      }
    } catch {
      // The server is away; keep trying until the deadline.
    }
    await new Promise((r) => setTimeout(r, 300));
  }
}

// Up-push: resolves once the server accepted it (its sinks have it).
$("up-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const out = $("up-result");
  delete out.dataset.accepted;
  if (!client) {
    out.textContent = "connect and bind first";
    return;
  }
  const text = $("up-content").value;
  out.textContent = "sending…";
  try {
    await client.push(text);
    out.textContent = `accepted by the server: your backend has "${text}"`;
    out.dataset.accepted = "1";
  } catch (err) {
    out.textContent = `not accepted (${err.code}${err.retryable ? ", retry later" : ""}): ${err.message}`;
    out.dataset.error = err.code;
  }
});

if (params.get("ws")) $("server").value = params.get("ws");
if (params.get("user")) {
  $("user").value = params.get("user");
  $("push-user").value = params.get("user");
  $("bind-form").requestSubmit();
}
document.body.dataset.ready = "1";
