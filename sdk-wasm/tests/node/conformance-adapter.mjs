// The conformance kit's adapter for the browser package, run in Node:
//   mpush-conformance client --ws --label node -- node conformance-adapter.mjs [package dir]
// It speaks the kit's contract (conformance/README.md): the connection from
// MPUSH_CONFORMANCE_* variables, what the application sees as JSON lines on
// stdout, a message that needs an ACK acknowledged after it was printed.
// It loads `mpush-sdk/classic` (mpush's handshake) from the built package
// (sdk-wasm/pkg by default, what ./scripts/build-web packs).
import { readFileSync } from "node:fs";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const pkg = resolve(process.argv[2] ?? join(root, "sdk-wasm", "pkg"));
const sdk = await import(pathToFileURL(join(pkg, "mpush_sdk_classic.js")).href);
await sdk.default({ module_or_path: readFileSync(join(pkg, "mpush_sdk_classic_core_bg.wasm")) });

const env = (k) => process.env[`MPUSH_CONFORMANCE_${k}`] ?? "";
const say = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);
// The resume ticket lives as long as the process (fast connect on reconnect).
const kept = new Map();
const storage = {
  getItem: (k) => kept.get(k) ?? null,
  setItem: (k, v) => void kept.set(k, String(v)),
  removeItem: (k) => void kept.delete(k),
};
const client = new sdk.PushClient({
  servers: [env("SERVER")],
  ...(env("PUBLIC_KEY") ? { publicKey: env("PUBLIC_KEY") } : {}),
  allowPublishedKey: true,
  deviceId: env("DEVICE"),
  storage,
  onMessage: (m) => {
    say({ event: "message", text: m.text, traceId: m.traceId, messageId: m.messageId ?? null, needsAck: m.needsAck });
    if (m.needsAck) client.ack(m);
  },
  onStateChange: (state, detail) => {
    if (state === "connected") say({ event: "connected", resumed: Boolean(detail?.resumed) });
    if (state === "disconnected") say({ event: "disconnected", retryInMs: detail?.retryInMs ?? null });
  },
  onKicked: (k) => say({ event: "kicked", deviceId: k?.deviceId ?? null }),
  onError: (e) => process.stderr.write(`${e.code}: ${e.message}\n`),
});
client.connect().catch((e) => process.stderr.write(`connect: ${e.code ?? ""} ${e.message}\n`));
const user = env("USER");
client
  .bind(user)
  .then(() => say({ event: "bound", userId: user }))
  .catch((e) => say({ event: "bind_failed", userId: user, reason: `${e.code}: ${e.message}` }));
