// Starts the real mpush-server binary for the browser tests: listeners on
// 127.0.0.1 (port 0 unless given), addresses read from its stdout, and a
// restart on the same ports. Used by with-server.mjs and the demo's
// Playwright test.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

function binary() {
  const override = process.env.MPUSH_SERVER_BIN;
  if (override) return override;
  for (const p of ["target/debug/mpush-server", "target/release/mpush-server"]) {
    if (existsSync(join(root, p))) return join(root, p);
  }
  throw new Error("no mpush-server binary: run `cargo build -p mpush-server` first");
}

/** Starts the server; resolves to {tcp, ws, http, wsUrl, apiUrl, stop(), restart()}. */
export async function startServer({ env = {}, tcp = "127.0.0.1:0", ws = "127.0.0.1:0", http = "127.0.0.1:0", timeoutMs = 20000 } = {}) {
  const bin = binary();
  const launch = (addrs) =>
    new Promise((resolve, reject) => {
      const child = spawn(bin, ["--tcp", addrs.tcp, "--ws", addrs.ws, "--http", addrs.http], {
        cwd: root,
        env: { RUST_LOG: "warn", ...process.env, ...env },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      let err = "";
      const timer = setTimeout(() => {
        child.kill("SIGKILL");
        reject(new Error(`mpush-server did not start in ${timeoutMs} ms\n${out}\n${err}`));
      }, timeoutMs);
      child.stderr.on("data", (d) => {
        err += d;
        if (process.env.MPUSH_TEST_VERBOSE) process.stderr.write(d);
      });
      child.stdout.on("data", (d) => {
        out += d;
        const t = /TCP gateway\s+(\S+)/.exec(out);
        const w = /WebSocket gateway\s+(wss?):\/\/(\S+?)\//.exec(out);
        const h = /HTTP API\s+http:\/\/(\S+?)\//.exec(out);
        if (t && w && h) {
          clearTimeout(timer);
          resolve({ child, tcp: t[1], ws: w[2], wsScheme: w[1], http: h[1] });
        }
      });
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`mpush-server exited (${code}) before listening\n${out}\n${err}`));
      });
    });
  let running = await launch({ tcp, ws, http });
  const stopChild = (child) =>
    new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      const kill = setTimeout(() => child.kill("SIGKILL"), 5000);
      child.once("exit", () => {
        clearTimeout(kill);
        resolve();
      });
      child.kill("SIGTERM");
    });
  const server = {
    get tcp() { return running.tcp; },
    get ws() { return running.ws; },
    get http() { return running.http; },
    get wsUrl() { return `${running.wsScheme}://${running.ws}/`; },
    get apiUrl() { return `http://${running.http}`; },
    async stop() { await stopChild(running.child); },
    /** Stops, then starts again on the same ports (a fresh, empty server). */
    async restart() {
      const addrs = { tcp: running.tcp, ws: running.ws, http: running.http };
      await stopChild(running.child);
      running = await launch(addrs);
    },
  };
  return server;
}

/** Starts a throwaway redis-server on a free loopback port: {url, stop()}. */
export async function startRedis() {
  const { createServer } = await import("node:net");
  const port = await new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const child = spawn("redis-server", ["--bind", "127.0.0.1", "--port", String(port), "--save", "", "--appendonly", "no"], { stdio: ["ignore", "pipe", "pipe"] });
  await new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`redis-server did not start\n${out}`)), 10000);
    child.stdout.on("data", (d) => {
      out += d;
      if (/Ready to accept connections/.test(out)) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on("exit", (c) => {
      clearTimeout(timer);
      reject(new Error(`redis-server exited (${c})\n${out}`));
    });
  });
  return {
    url: `redis://127.0.0.1:${port}/`,
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once("exit", resolve);
        child.kill("SIGTERM");
      }),
  };
}

/**
 * A webhook receiver for the server's sinks, on a free loopback port: checks
 * every request's signature (HMAC-SHA256 of "timestamp.body" under `secret`,
 * `X-Mpush-Signature: v1=<hex>`) and timestamp, keeps the events.
 * Resolves to {url, events, badSignatures, stop()}.
 */
export async function startWebhookReceiver({ secret }) {
  const { createServer } = await import("node:http");
  const { createHmac, timingSafeEqual } = await import("node:crypto");
  const state = { events: [], badSignatures: 0 };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const ts = req.headers["x-mpush-timestamp"] ?? "";
      const sig = String(req.headers["x-mpush-signature"] ?? "");
      const expected = "v1=" + createHmac("sha256", secret).update(`${ts}.`).update(body).digest("hex");
      const fresh = Math.abs(Date.now() / 1000 - Number(ts)) <= 300;
      if (!fresh || sig.length !== expected.length || !timingSafeEqual(Buffer.from(sig), Buffer.from(expected))) {
        state.badSignatures += 1;
        res.writeHead(401).end();
        return;
      }
      state.events.push(...(JSON.parse(body.toString("utf8")).events ?? []));
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}/hook`,
    get events() { return state.events; },
    get badSignatures() { return state.badSignatures; },
    stop: () => new Promise((r) => server.close(r)),
  };
}
