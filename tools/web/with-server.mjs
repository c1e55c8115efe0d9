// Runs a command with a real mpush-server started for it:
//   node tools/web/with-server.mjs [--redis] [--wss] -- <command> [args...]
// The command gets MPUSH_TEST_WS (ws:// URL), MPUSH_TEST_TCP (host:port),
// MPUSH_TEST_API (http:// URL) and MPUSH_TEST_CONTROL (http:// URL: a
// `POST /restart` there restarts the server on the same ports).
// The server allows CORS from any origin (test pages are served elsewhere)
// and retries unacknowledged pushes quickly. Its webhook sink (up-pushes and
// delivery callbacks) posts to a receiver here that checks signatures;
// `GET $MPUSH_TEST_CONTROL/webhook/events` answers {events, badSignatures}. With --redis it runs in cluster
// mode on its own redis-server (sessions then survive a restart). With --wss
// a second server runs with TLS on its WebSocket gateway (a self-signed
// certificate for 127.0.0.1 made here with openssl): MPUSH_TEST_WSS (wss://
// URL) and MPUSH_TEST_WSS_API (its API, plain http).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer } from "node:http";
import { startServer, startRedis, startWebhookReceiver, root } from "./server.mjs";

const i = process.argv.indexOf("--");
const flags = i >= 0 ? process.argv.slice(2, i) : process.argv.slice(2);
const cmd = i >= 0 ? process.argv.slice(i + 1) : [];
if (cmd.length === 0) {
  console.error("usage: node with-server.mjs [--redis] -- <command> [args...]");
  process.exit(2);
}
const redis = flags.includes("--redis") ? await startRedis() : null;
const secret = "with-server-webhook-secret";
const hook = await startWebhookReceiver({ secret });
const server = await startServer({
  env: {
    MPUSH__SINKS__WEBHOOKS: `[{url="${hook.url}",secret="${secret}",events=["up_push","callback"]}]`,
    MPUSH__SECURITY__CORS_ORIGINS: '["*"]',
    MPUSH__DELIVERY__ACK_WAITS_MS: "[300,300,300]",
    ...(redis ? { MPUSH__CLUSTER__REDIS: redis.url, MPUSH__CLUSTER__INTERNAL: "127.0.0.1:0" } : {}),
  },
});
// The TLS server of --wss: its own certificate, made for this run.
let tls = null;
if (flags.includes("--wss")) {
  const dir = mkdtempSync(join(tmpdir(), "mpush-wss-"));
  const [cert, key] = [join(dir, "cert.pem"), join(dir, "key.pem")];
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], { stdio: "ignore" });
  const wss = await startServer({
    env: {
      MPUSH__TLS__CERT_FILE: cert,
      MPUSH__TLS__KEY_FILE: key,
      MPUSH__TLS__LISTENERS: '["ws"]',
      MPUSH__SECURITY__CORS_ORIGINS: '["*"]',
    },
  });
  tls = { server: wss, dir };
}
const control = createServer(async (req, res) => {
  if (req.method === "POST" && req.url === "/restart") {
    try {
      await server.restart();
      res.writeHead(200).end("restarted\n");
    } catch (e) {
      res.writeHead(500).end(String(e));
    }
  } else if (req.method === "GET" && req.url === "/webhook/events") {
    res.writeHead(200, { "content-type": "application/json", "access-control-allow-origin": "*" });
    res.end(JSON.stringify({ events: hook.events, badSignatures: hook.badSignatures }));
  } else {
    res.writeHead(404).end();
  }
});
await new Promise((r) => control.listen(0, "127.0.0.1", r));
const controlUrl = `http://127.0.0.1:${control.address().port}`;
console.log(`with-server: mpush-server at ${server.wsUrl}, ${server.tcp} and ${server.apiUrl}${redis ? ` on ${redis.url}` : ""}`);
const child = spawn(cmd[0], cmd.slice(1), {
  cwd: root,
  stdio: "inherit",
  env: {
    ...process.env,
    MPUSH_TEST_WS: server.wsUrl,
    MPUSH_TEST_TCP: server.tcp,
    MPUSH_TEST_API: server.apiUrl,
    MPUSH_TEST_CONTROL: controlUrl,
    ...(tls ? { MPUSH_TEST_WSS: tls.server.wsUrl, MPUSH_TEST_WSS_API: tls.server.apiUrl } : {}),
  },
});
const code = await new Promise((resolve) => child.on("exit", (c, sig) => resolve(c ?? (sig ? 1 : 0))));
control.close();
await server.stop();
if (tls) {
  await tls.server.stop();
  rmSync(tls.dir, { recursive: true, force: true });
}
await hook.stop();
if (redis) await redis.stop();
process.exit(code);
