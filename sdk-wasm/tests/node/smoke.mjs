// The npm package's own smoke test, in Node:
//   node smoke.mjs <package .tgz>   (with MPUSH_TEST_WS / MPUSH_TEST_API: also against a server)
// Installs the packed tarball into a fresh folder (as a user would), checks
// its manifest and types, runs every shared protocol vector through
// `mpush-sdk/conformance`, and, given a running server, connects with the
// real `mpush-sdk` module over Node's WebSocket, binds and receives a push.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, cpSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..", "..");
const tarball = resolve(process.argv[2] ?? join(root, "sdk-wasm", "mpush-sdk.tgz"));
const dir = mkdtempSync(join(tmpdir(), "mpush-sdk-smoke-"));
let failed = 0;
let passed = 0;
async function check(name, f) {
  try {
    await f();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}\n${e?.stack ?? e}`);
  }
}

try {
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "smoke", private: true, type: "module" }));
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", tarball], { cwd: dir, stdio: "inherit" });
  const pkgDir = join(dir, "node_modules", "mpush-sdk");
  // Resolve the package from the consumer folder, through its "exports".
  const resolveFrom = (spec) =>
    execFileSync(process.execPath, ["--input-type=module", "-e", `console.log(import.meta.resolve(${JSON.stringify(spec)}))`], { cwd: dir }).toString().trim();
  const mainUrl = resolveFrom("mpush-sdk");
  const confUrl = resolveFrom("mpush-sdk/conformance");

  await check("manifest: exports, types, files", () => {
    const m = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
    assert.equal(m.name, "mpush-sdk");
    assert.equal(m.type, "module");
    assert.equal(m.exports["."].types, "./mpush_sdk.d.ts");
    assert.ok(m.exports["./conformance"]);
    assert.equal(m.exports["./classic"].types, "./mpush_sdk_classic.d.ts");
    assert.equal(m.engines.node, ">=18");
    const d = readFileSync(join(pkgDir, "mpush_sdk.d.ts"), "utf8");
    for (const s of ["export interface PushClientOptions", "events(): AsyncIterableIterator<PushEvent>", "export type PushEvent", "connect(): Promise<void>"]) {
      assert.ok(d.includes(s), `d.ts lacks ${s}`);
    }
    assert.ok(mainUrl.endsWith("/node_modules/mpush-sdk/mpush_sdk.js"), mainUrl);
  });

  await check("the driver names every slot as the core does (sdk-wasm/src/layout.rs)", async () => {
    // The self-test module exports the core's layout enums; the driver
    // (js/client.js) its NAME_SLOT_FIELD constants. Any name or position
    // that differs, or is on one side only, fails here.
    const conf = await import(confUrl);
    const driver = await import(pathToFileURL(join(root, "sdk-wasm", "js", "client.js")).href);
    const snake = (s) => s.replace(/([a-z0-9])([A-Z])/g, "$1_$2").toUpperCase();
    const core = {};
    for (const e of ["NumberSlot", "ItemSlot", "StateSlot", "MessageSlot", "KickedSlot", "BindSlot", "SettledSlot"]) {
      assert.ok(conf[e], `the self-test module exports no ${e}`);
      for (const [k, v] of Object.entries(conf[e])) if (typeof v === "number") core[`${snake(e)}_${snake(k)}`] = v;
    }
    const js = Object.fromEntries(Object.entries(driver).filter(([k]) => k.includes("_SLOT_")));
    assert.ok(Object.keys(core).length >= 30, `only ${Object.keys(core).length} slots`);
    assert.deepEqual(js, core);
    // Every item's slots are distinct and start after the kind.
    for (const prefix of ["STATE", "MESSAGE", "KICKED", "BIND", "SETTLED"]) {
      const slots = Object.entries(core).filter(([k]) => k.startsWith(`${prefix}_SLOT_`) && !k.endsWith("_COUNT"));
      const at = slots.map(([, v]) => v).sort((a, b) => a - b);
      assert.deepEqual(at, at.map((_, i) => i + 1), `${prefix}: ${JSON.stringify(slots)}`);
      assert.equal(core[`${prefix}_SLOT_COUNT`], at.length + 1);
    }
  });

  await check("every shared protocol vector matches (mpush-sdk/conformance)", async () => {
    const conf = await import(confUrl);
    await conf.default({ module_or_path: readFileSync(new URL(resolveFrom("mpush-sdk/mpush_sdk_conformance_bg.wasm"))) });
    const vdir = join(root, "protocol", "testdata", "vectors");
    const names = [];
    for (const f of readdirSync(vdir).filter((f) => f.endsWith(".json")).sort()) {
      names.push(conf.checkVector(readFileSync(join(vdir, f), "utf8")));
    }
    assert.ok(names.length >= 20, `only ${names.length} vectors`);
    for (const must of ["handshake_plain", "handshakeok_aes", "bind_packet", "v2_keys", "token_dat"]) {
      assert.ok(names.includes(must), `missing ${must}`);
    }
    // A tampered vector is an Error naming it, not a crash.
    const v = JSON.parse(readFileSync(join(vdir, "bind_packet.json"), "utf8"));
    v.hex = v.hex.slice(0, -1) + (v.hex.endsWith("0") ? "1" : "0");
    assert.throws(() => conf.checkVector(JSON.stringify(v)), /bind_packet/);
    assert.throws(() => conf.checkVector("not json"), /not JSON/);
    console.log(`     ${names.length} vectors`);
    // The one (error, code) table of every SDK.
    const table = JSON.parse(readFileSync(join(root, "sdk-core", "testdata", "error-codes.json"), "utf8")).errors;
    const errors = conf.errorTable();
    assert.deepEqual(
      errors.map((e) => [e instanceof Error, e.code, e.retryable]),
      table.map((r) => [true, r.code, r.retryable]),
    );
  });

  const sdk = await import(mainUrl);
  await sdk.default({ module_or_path: readFileSync(new URL(resolveFrom("mpush-sdk/mpush_sdk_core_bg.wasm"))) });

  await check("the app module loads and refuses bad options clearly", () => {
    assert.match(sdk.version(), /^\d+\.\d+\.\d+/);
    assert.equal(sdk.checkVector, undefined, "the self-test is not in the app module");
    try {
      new sdk.PushClient({ servers: "tcp://nope" });
      assert.fail("accepted a tcp:// server");
    } catch (e) {
      assert.equal(e.code, "invalid_input");
      assert.match(e.message, /options\.servers/);
    }
  });

  const classic = await import(resolveFrom("mpush-sdk/classic"));
  await classic.default({ module_or_path: readFileSync(new URL(resolveFrom("mpush-sdk/mpush_sdk_classic_core_bg.wasm"))) });

  await check("mpush-sdk has no RSA or AES: wss://, or ws:// to this machine; mpush-sdk/classic has both", () => {
    assert.equal(classic.version(), sdk.version());
    assert.throws(() => new sdk.PushClient({ servers: "ws://push.example.com/", storage: null }), (e) => e.code === "invalid_input" && /wss:\/\//.test(e.message));
    assert.throws(() => new sdk.PushClient({ servers: "wss://h/", publicKey: "x", storage: null }), (e) => e.code === "invalid_input" && /RSA/.test(e.message));
    for (const servers of ["wss://push.example.com/", "ws://127.0.0.1:1/", "ws://localhost:8088/"]) {
      const c = new sdk.PushClient({ servers, storage: null });
      assert.equal(c.state, "idle");
      c.close();
      assert.equal(c.state, "closed");
    }
    // mpush's published key (the classic default) to another host over
    // plain ws://: refused unless the app opts in by name.
    assert.throws(() => new classic.PushClient({ servers: "ws://push.example.com/", storage: null }),
      (e) => e.code === "invalid_input" && /allowPublishedKey/.test(e.message));
    new classic.PushClient({ servers: "ws://push.example.com/", storage: null, allowPublishedKey: true }).close();
    new classic.PushClient({ servers: "wss://push.example.com/", storage: null }).close();
    const size = (f) => readFileSync(join(pkgDir, f)).length;
    assert.ok(size("mpush_sdk_core_bg.wasm") < size("mpush_sdk_classic_core_bg.wasm") * 0.6, "smaller than the classic module");
  });

  await check("TypeScript: a consumer type-checks under --strict", () => {
    const tsc = join(root, "tools", "web", "node_modules", ".bin", "tsc");
    cpSync(join(here, "consumer.ts"), join(dir, "consumer.ts"));
    execFileSync(tsc, ["--strict", "--noEmit", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext", "--lib", "es2022,dom,dom.iterable,esnext.disposable", "consumer.ts"], { cwd: dir, stdio: "inherit" });
  });

  const ws = process.env.MPUSH_TEST_WS;
  const api = process.env.MPUSH_TEST_API;
  if (ws && api && typeof WebSocket === "function") {
    // The default module over ws:// to this machine: the server's WebSocket
    // gateway listens on loopback (its default), which counts as secure.
    for (const [name, mod] of [["mpush-sdk (transport-secured profile)", sdk], ["mpush-sdk/classic (RSA and AES)", classic]]) {
    await check(`${name}: connects over Node's WebSocket, binds, receives and acknowledges a push`, async () => {
      const got = [];
      const client = new mod.PushClient({ servers: ws, storage: null, onMessage: (m) => got.push(m) });
      await client.connect();
      const user = `node-${process.pid}-${mod === sdk ? "t" : "c"}`;
      await client.bind(user, { tags: ["node"] });
      const r = await (await fetch(`${api}/api/v1/push`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ userId: user, content: "from node", ackMode: "biz" }) })).json();
      for (let i = 0; i < 250 && got.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      assert.equal(got.length, 1);
      assert.equal(got[0].text, "from node");
      assert.ok(client.ack(got[0].id));
      let state = "";
      for (let i = 0; i < 250 && state !== "ACK"; i++) {
        state = (await (await fetch(`${api}/api/v1/traces/${r.traceId}`)).json()).recipients[0].state;
        if (state !== "ACK") await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(state, "ACK");
      client.close();
      assert.equal(client.state, "closed");
    });
    }

    await check("a runtime without a global WebSocket: refused clearly, or given a constructor", async () => {
      const NodeWebSocket = globalThis.WebSocket;
      let opened = 0;
      // Counts what the SDK opens: proof that it uses the constructor it was given.
      class Counted extends NodeWebSocket {
        constructor(url) { super(url); opened++; }
      }
      delete globalThis.WebSocket;
      try {
        assert.throws(() => new sdk.PushClient({ servers: ws, storage: null }), (e) => e.code === "invalid_input" && /options\.WebSocket/.test(e.message));
        const client = new sdk.PushClient({ servers: ws, storage: null, WebSocket: Counted });
        await client.connect();
        await client.bind(`node-injected-${process.pid}`);
        assert.equal(client.state, "connected");
        assert.equal(opened, 1);
        client.close();
      } finally {
        globalThis.WebSocket = NodeWebSocket;
      }
    });
  } else {
    console.log("skip connect test: no MPUSH_TEST_WS/MPUSH_TEST_API or no global WebSocket (use NODE_OPTIONS=--experimental-websocket)");
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(`node smoke: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
