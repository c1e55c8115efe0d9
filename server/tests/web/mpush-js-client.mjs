// mpush 0.8.1's own web client flow in real headless Chromium, against a
// real server: the legacy JSON frames of mpush-client-js (handshake with
// `osName: "web " + navigator.userAgent`, bind, push, ACK), written here
// from its protocol (no mpush code is copied). Each browser context gets a
// real current user agent (and the first keeps Chromium's own), so the OS
// name is what deployed mpush pages send: well over the 64 bytes the
// server once refused. Every page binds and receives a push that it
// acknowledges; a broadcast whose condition reads the user agent reaches
// the Chrome pages only.
//   node server/tests/web/mpush-js-client.mjs   (after `cargo build -p mpush-server`)
import { createRequire } from "node:module";
import { join } from "node:path";
import assert from "node:assert/strict";
import { startServer, root } from "../../../tools/web/server.mjs";

const { chromium } = createRequire(join(root, "tools", "web", "package.json"))("playwright-core");

// Current browsers' user agents (late 2026), as navigator.userAgent gives them.
const AGENTS = [
  null, // headless Chromium's own
  "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/143.0.0.0 Safari/537.36 Edg/143.0.0.0",
  "Mozilla/5.0 (Linux; Android 15; SM-S928B Build/AP3A.240905.015.A2; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/143.0.7499.52 Mobile Safari/537.36 [FB_IAB/FB4A;FBAV/512.0.0.52.101;IABMV/1;]",
  "Mozilla/5.0 (iPhone; CPU iPhone OS 18_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.7 Mobile/15E148 Safari/604.1",
  "Mozilla/5.0 (Macintosh; Intel Mac OS X 10.15; rv:145.0) Gecko/20100101 Firefox/145.0",
];

// The page: mpush-client-js's frames, one JSON object per WebSocket message.
const PAGE = `<!doctype html><meta charset="utf-8"><title>mpush web client</title><script>
window.mpushTest = { state: "new", pushes: [], errors: [] };
window.startMpush = (url, userId, tags) => {
  const t = window.mpushTest;
  let seq = 1;
  const ws = new WebSocket(url);
  const send = (cmd, body, sessionId) =>
    ws.send(JSON.stringify({ cmd, flags: 16, sessionId: sessionId || seq++, body }));
  ws.onopen = () => send(2, { deviceId: "web-" + userId, osName: "web " + navigator.userAgent,
                              osVersion: "55.2", clientVersion: "1.0" });
  ws.onmessage = (e) => {
    const p = JSON.parse(e.data);
    if (p.cmd === 2) { t.state = "handshaken"; send(5, tags ? { userId, tags } : { userId }); }
    else if (p.cmd === 11 && p.body && p.body.cmd === 5) t.state = "bound";
    else if (p.cmd === 10) { t.state = "error"; t.errors.push(p.body); }
    else if (p.cmd === 15) {
      if ((p.flags & 8) !== 0) send(23, null, p.sessionId);
      t.pushes.push(p.body.content);
    }
  };
  ws.onclose = () => { if (t.state !== "error") t.state = "closed"; };
};
</script>`;

const server = await startServer();
const api = async (path, body) => {
  const r = await fetch(`${server.apiUrl}${path}`, body
    ? { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }
    : {});
  return { status: r.status, body: await r.json() };
};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
let passed = 0;
let failed = 0;
const check = async (name, f) => {
  try {
    await f();
    passed++;
    console.log(`ok: ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAILED: ${name}: ${e.stack ?? e}`);
  }
};
const until = async (what, f, ms = 10000) => {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
};

try {
  const pages = [];
  for (const [i, ua] of AGENTS.entries()) {
    const context = await browser.newContext(ua ? { userAgent: ua } : {});
    const page = await context.newPage();
    await page.setContent(PAGE);
    const agent = await page.evaluate(() => navigator.userAgent);
    pages.push({ page, user: `web-user-${i}`, agent });
  }
  await check("every real user agent is longer than the old 64-byte cap", async () => {
    for (const p of pages) assert.ok(`web ${p.agent}`.length > 64, p.agent);
  });
  for (const p of pages) {
    await check(`handshake and bind with osName "web ${p.agent.slice(0, 40)}..."`, async () => {
      await p.page.evaluate(([url, user]) => window.startMpush(url, user, "web,beta"), [server.wsUrl, p.user]);
      await until(`${p.user} bound`, () =>
        p.page.evaluate(() => ["bound", "error", "closed"].includes(window.mpushTest.state)));
      const st = await p.page.evaluate(() => window.mpushTest);
      assert.equal(st.state, "bound", JSON.stringify(st));
    });
  }
  for (const p of pages) {
    await check(`${p.user} receives a push and acknowledges it`, async () => {
      const r = await api("/api/v1/push", { userId: p.user, content: `hello ${p.user}`, ackMode: "auto" });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      await until("the push", () => p.page.evaluate((c) => window.mpushTest.pushes.includes(c), `hello ${p.user}`));
      await until("its ACK in the trace", async () => {
        const t = await api(`/api/v1/traces/${r.body.traceId}`);
        return t.body.recipients?.some((x) => x.state === "ACK");
      });
    });
  }
  await check("a condition on the user agent reaches the Chrome pages only", async () => {
    const r = await api("/api/v1/broadcast", {
      content: "for chrome",
      condition: 'osName.indexOf("web ") == 0 && osName.indexOf("Chrome/") > 0 && tags.split(",").indexOf("beta") >= 0',
    });
    assert.equal(r.status, 202, JSON.stringify(r.body));
    const chrome = pages.filter((p) => p.agent.includes("Chrome/"));
    assert.ok(chrome.length >= 3 && chrome.length < pages.length);
    for (const p of chrome) {
      await until(`${p.user} gets it`, () => p.page.evaluate(() => window.mpushTest.pushes.includes("for chrome")));
    }
    await new Promise((r) => setTimeout(r, 300));
    for (const p of pages.filter((p) => !p.agent.includes("Chrome/"))) {
      const got = await p.page.evaluate(() => window.mpushTest.pushes);
      assert.ok(!got.includes("for chrome"), `${p.agent}: ${got}`);
    }
  });
} finally {
  await browser.close();
  await server.stop();
}
console.log(`mpush-js-client: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
