// End-to-end test of the demo page in headless Chromium (Playwright):
// the real server serves the page (with the packed mpush-sdk installed in
// demo-web/node_modules), the page binds a user, a push sent with the page's
// form arrives with its ACK state, a BIZ message is acknowledged from the
// page, then the server restarts and the page reconnects by itself and
// receives a message pushed while it was away; the page shows a push's trace
// states as they change, and an up-push makes the round trip through the
// CLI's `mpush webhook-listen --echo-api` and back. Screenshot:
// test-artifacts/demo-web.png.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { createRequire } from "node:module";
import { join } from "node:path";
import assert from "node:assert/strict";
import { startServer, root } from "../../tools/web/server.mjs";

const { chromium } = createRequire(join(root, "tools", "web", "package.json"))("playwright-core");
const artifacts = join(root, "test-artifacts");
mkdirSync(artifacts, { recursive: true });

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
// The backend for up-pushes: the CLI's receiver, echoing each one back to
// its sender through the server's API (ports chosen first: each names the other).
const mpushCli = join(root, "target", "debug", "mpush");
assert.ok(existsSync(mpushCli), "build the CLI first: cargo build -p mpush-cli");
const [hookPort, httpPort] = [await freePort(), await freePort()];
const secret = "demo-secret-0123456789";
const hook = spawn(mpushCli, ["webhook-listen", "--listen", `127.0.0.1:${hookPort}`, "--secret", secret, "--echo-api", `http://127.0.0.1:${httpPort}`], { stdio: ["ignore", "pipe", "inherit"] });
let hooked = "";
hook.stdout.on("data", (d) => (hooked += d));
const server = await startServer({
  http: `127.0.0.1:${httpPort}`,
  env: {
    MPUSH__NET__DEMO_DIR: join(root, "demo-web"),
    MPUSH__SINKS__WEBHOOKS: `[{url="http://127.0.0.1:${hookPort}/",secret="${secret}"}]`,
  },
});
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
const page = await browser.newPage({ viewport: { width: 1100, height: 800 } });
const logs = [];
page.on("console", (m) => logs.push(`[${m.type()}] ${m.text()}`));
page.on("pageerror", (e) => logs.push(`[pageerror] ${e.message}`));

const api = async (path, body) => {
  const r = await fetch(`${server.apiUrl}${path}`, body ? { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) } : {});
  return [r.status, await r.json()];
};
const traceState = async (trace) => (await api(`/api/v1/traces/${trace}`))[1].recipients?.[0]?.state;
const message = (text) => page.locator(`#messages li[data-text="${text}"]`);

let ok = false;
try {
  const user = `demo-${process.pid}`;
  // Reconnect delay 1.5-2.5 s: room to push while the page is away.
  // No ?sdk=: a page from this machine loads the default module (no RSA or
  // AES), which the server's loopback WebSocket gateway takes over ws://.
  await page.goto(`${server.apiUrl}/demo/?user=${user}&backoffMs=2000`);
  await page.locator("#state[data-state=connected]").waitFor({ timeout: 15000 });
  await page.locator(`body[data-bound="${user}"]`).waitFor({ timeout: 15000 });
  assert.equal(await page.locator("body").getAttribute("data-sdk"), "default");
  console.log("ok   the page connected (allocator, v2; the package's default module, no RSA or AES) and bound", user);
  assert.match(await page.locator("#detail").textContent(), /v2/);

  // A push with the page's own form (the HTTP API), acknowledged by the SDK.
  await page.fill("#push-content", "first message");
  await page.selectOption("#push-ack", "auto");
  await page.click("#send");
  await message("first message").locator('.ack[data-ack="auto"]').waitFor({ timeout: 10000 });
  console.log("ok   a push from the form arrived, acked by the SDK");

  // BIZ: waits for the app; the Ack button sends it; the trace says ACK.
  await page.fill("#push-content", "please ack");
  await page.selectOption("#push-ack", "biz");
  await page.click("#send");
  await message("please ack").locator('.ack[data-ack="waiting"]').waitFor({ timeout: 10000 });
  const trace = await page.locator("#push-result").getAttribute("data-trace-id");
  assert.ok(trace, "the page shows the trace id");
  await message("please ack").locator(".ack-button").click();
  await message("please ack").locator('.ack[data-ack="acked"]').waitFor();
  let state;
  for (let i = 0; i < 100 && (state = await traceState(trace)) !== "ACK"; i++) await new Promise((r) => setTimeout(r, 50));
  assert.equal(state, "ACK");
  console.log("ok   a BIZ push was acknowledged from the page (trace: ACK)");
  // The page followed that push's trace as it changed.
  await page.locator(`#trace[data-trace-id="${trace}"][data-state="ACK"]`).waitFor({ timeout: 10000 });
  const shown = await page.locator("#trace li").evaluateAll((lis) => lis.map((li) => li.dataset.state));
  for (const s of ["DISPATCHED", "DELIVERED", "ACK"]) assert.ok(shown.includes(s), `trace shows ${s}: ${shown}`);
  console.log(`ok   the page showed the trace's states as they changed: ${shown.join(" → ")}`);

  // Up-push round trip: the page sends up, the server's webhook sink hands
  // it to the receiver (signed), which pushes "echo: ..." back.
  await page.fill("#up-content", "hello backend");
  await page.click("#up-send");
  await page.locator('#up-result[data-accepted="1"]').waitFor({ timeout: 10000 });
  await message("echo: hello backend").waitFor({ timeout: 10000 });
  const line = hooked.split("\n").find((l) => l.includes("hello backend"));
  assert.ok(line, `webhook-listen printed the up-push: ${hooked}`);
  assert.equal(JSON.parse(line).userId, user);
  console.log("ok   an up-push made the round trip: page → server → webhook-listen → API → page");

  // The server goes away and comes back (empty: a fresh process).
  await server.stop();
  await page.locator("#state[data-state=disconnected]").waitFor({ timeout: 10000 });
  await server.restart();
  const [status, r] = await api("/api/v1/push", { userId: user, content: "while you were away", ackMode: "auto", ttlSeconds: 600 });
  assert.equal(status, 200);
  assert.deepEqual([r.dispatched, r.stored], [0, true], `the page was still away: ${JSON.stringify(r)}`);
  console.log("ok   server restarted; pushed while the page was away (kept in the inbox)");
  await message("while you were away").waitFor({ timeout: 20000 });
  await page.locator("#state[data-state=connected]").waitFor();
  console.log("ok   the page reconnected by itself and received it");
  await page.screenshot({ path: join(artifacts, "demo-web.png"), fullPage: true });
  console.log(`     screenshot: ${join("test-artifacts", "demo-web.png")}`);
  ok = true;
} catch (e) {
  console.log(`FAIL demo-web e2e: ${e.stack ?? e}`);
  console.log(logs.join("\n"));
  await page.screenshot({ path: join(artifacts, "demo-web-failure.png"), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
  await server.stop();
  hook.kill();
}
console.log(`demo-web e2e: ${ok ? "1 passed, 0 failed" : "0 passed, 1 failed"}`);
process.exit(ok ? 0 : 1);
