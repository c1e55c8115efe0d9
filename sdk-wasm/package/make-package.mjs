// Writes package.json, README.md and LICENSE into the package folder.
// Usage: node make-package.mjs <pkg dir>
import { readFileSync, writeFileSync, copyFileSync, existsSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = process.argv[2];
const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const cargo = readFileSync(join(root, "Cargo.toml"), "utf8");
const version = /\[workspace\.package\][^[]*?version\s*=\s*"([^"]+)"/s.exec(cargo)?.[1];
if (!version) throw new Error("no workspace version in Cargo.toml");
// The public addresses come from Cargo.toml's [workspace.package]
// (`repository`, `homepage`), the one place a release sets them; the package
// has none until the project has a public home.
const field = (name) => new RegExp(`\\[workspace\\.package\\][^[]*?${name}\\s*=\\s*"([^"]+)"`, "s").exec(cargo)?.[1];
const repository = field("repository");
const homepage = field("homepage") ?? repository;

// Each module: one bundled ES module (its core's bindings, and for the app
// modules the driver, js/client.js), its types and its .wasm.
const files = [
  ...["mpush_sdk", "mpush_sdk_classic"].flatMap((m) => [`${m}.js`, `${m}.d.ts`, `${m}_core_bg.wasm`]),
  ...["mpush_sdk_conformance.js", "mpush_sdk_conformance.d.ts", "mpush_sdk_conformance_bg.wasm"],
];
for (const f of files) {
  if (!existsSync(join(pkg, f))) throw new Error(`the package is missing ${f}`);
}
const manifest = {
  name: "mpush-sdk",
  version,
  description:
    "Browser SDK for mpush push servers: a WebSocket client with reconnect, fast connect, dedup, ACKs and an offline queue, in Rust compiled to WebAssembly.",
  license: "Apache-2.0",
  ...(repository ? { repository: { type: "git", url: `git+${repository}` } } : {}),
  ...(homepage ? { homepage } : {}),
  // Node 18+ (and other runtimes): pass the `WebSocket` option where there is no global one.
  engines: { node: ">=18" },
  type: "module",
  main: "./mpush_sdk.js",
  module: "./mpush_sdk.js",
  types: "./mpush_sdk.d.ts",
  exports: {
    // The transport-secured profile only (ADR 0005): wss://, or ws:// to a
    // server on this machine (loopback); no RSA or AES. 60 KiB gzipped.
    ".": { types: "./mpush_sdk.d.ts", default: "./mpush_sdk.js" },
    "./mpush_sdk_core_bg.wasm": "./mpush_sdk_core_bg.wasm",
    // The same API with mpush's RSA and AES handshake: ws:// anywhere, legacy mpush servers.
    "./classic": { types: "./mpush_sdk_classic.d.ts", default: "./mpush_sdk_classic.js" },
    "./mpush_sdk_classic_core_bg.wasm": "./mpush_sdk_classic_core_bg.wasm",
    // A self-test build with checkVector (the shared protocol vectors); apps never load it.
    "./conformance": { types: "./mpush_sdk_conformance.d.ts", default: "./mpush_sdk_conformance.js" },
    "./mpush_sdk_conformance_bg.wasm": "./mpush_sdk_conformance_bg.wasm",
    "./package.json": "./package.json",
  },
  files: [...files, "README.md", "LICENSE"],
  sideEffects: false,
  keywords: ["mpush", "push", "websocket", "wasm", "notifications"],
};
writeFileSync(join(pkg, "package.json"), JSON.stringify(manifest, null, 2) + "\n");
copyFileSync(join(root, "sdk-wasm", "README.md"), join(pkg, "README.md"));
copyFileSync(join(root, "LICENSE"), join(pkg, "LICENSE"));
console.log(`wrote ${join(pkg, "package.json")} (mpush-sdk ${version})`);
