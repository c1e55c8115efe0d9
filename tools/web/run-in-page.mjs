// Runs a documentation snippet as a page's module script in headless
// Chromium (scripts/docs-test, for blocks tagged `browser`):
//   node tools/web/run-in-page.mjs SNIPPET.js [--wait TEXT] [--then CMD] [--expect TEXT] [--timeout MS]
// The page is served from 127.0.0.1 (a port of its own) with an import map
// that resolves `mpush-sdk` and `mpush-sdk/classic` to the built package
// (sdk-wasm/pkg, what the tarball holds), as a bundler or `npm install`
// would. The page's console is printed. With --wait, once a console line
// contains TEXT, CMD (a shell command, e.g. the server banner's curl) runs;
// the run passes when a console line contains the --expect TEXT (or, without
// --expect, when the snippet finished) and no error was thrown.
import { createServer } from "node:http";
import { readFileSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join, extname, normalize } from "node:path";
import { execSync } from "node:child_process";
import { root } from "./server.mjs";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const snippetFile = args[0];
const wait = opt("--wait");
const then = opt("--then");
const expect = opt("--expect");
const timeoutMs = Number(opt("--timeout", "30000"));
const pkg = join(root, "sdk-wasm", "pkg");
if (!existsSync(join(pkg, "mpush_sdk.js"))) {
  console.error("the package is not built: ./scripts/build-web");
  process.exit(2);
}
const snippet = readFileSync(snippetFile, "utf8");
const page = `<!doctype html><meta charset="utf-8"><title>docs snippet</title>
<script type="importmap">{"imports": {"mpush-sdk": "/pkg/mpush_sdk.js", "mpush-sdk/classic": "/pkg/mpush_sdk_classic.js"}}</script>
<script type="module" src="/snippet.js"></script>`;
// The snippet runs as written; its completion is reported by a second module
// that imports it (a module's top-level await finishes before its importer runs).
const done = `import "/snippet-body.js"; console.log("[docs] snippet finished");`;
const types = { ".js": "text/javascript", ".wasm": "application/wasm", ".json": "application/json" };
const http = createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  const send = (body, type) => {
    res.writeHead(200, { "content-type": type, "cache-control": "no-store" });
    res.end(body);
  };
  if (url.pathname === "/") return send(page, "text/html");
  if (url.pathname === "/favicon.ico") {
    res.writeHead(204);
    return res.end();
  }
  if (url.pathname === "/snippet.js") return send(done, types[".js"]);
  if (url.pathname === "/snippet-body.js") return send(snippet, types[".js"]);
  if (url.pathname.startsWith("/pkg/")) {
    const f = normalize(join(pkg, url.pathname.slice(5)));
    if (f.startsWith(pkg) && existsSync(f)) return send(readFileSync(f), types[extname(f)] ?? "application/octet-stream");
  }
  res.writeHead(404);
  res.end();
});
await new Promise((r) => http.listen(0, "127.0.0.1", r));
const origin = `http://127.0.0.1:${http.address().port}`;

const { chromium } = createRequire(join(root, "tools", "web", "package.json"))("playwright-core");
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
let failed = null;
let finished = false;
let expected = !expect;
let ran = false;
const lines = [];
const settle = () => (expect ? expected : finished);
let wake;
const woken = new Promise((r) => (wake = r));
try {
  const p = await browser.newPage();
  p.on("console", (m) => {
    const text = m.text();
    lines.push(text);
    console.log(`  [page ${m.type()}] ${text}`);
    if (text === "[docs] snippet finished") finished = true;
    if (expect && text.includes(expect)) expected = true;
    if (wait && !ran && text.includes(wait)) {
      ran = true;
      try {
        console.log(`  $ ${then}`);
        console.log(execSync(then, { encoding: "utf8", shell: "/bin/bash", timeout: 20000 }).replace(/^/gm, "  "));
      } catch (e) {
        failed = `--then failed: ${e.message}`;
      }
    }
    if (settle() || failed) wake();
  });
  p.on("pageerror", (e) => {
    failed = `the snippet threw: ${e.message}`;
    wake();
  });
  await p.goto(origin + "/");
  let timer;
  await Promise.race([woken, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
  clearTimeout(timer);
  if (!failed && !settle()) {
    failed = expect ? `no console line contained ${JSON.stringify(expect)} within ${timeoutMs} ms` : `the snippet did not finish within ${timeoutMs} ms`;
  }
  if (!failed && wait && !ran) failed = `no console line contained ${JSON.stringify(wait)}`;
} finally {
  await browser.close();
  http.close();
}
if (failed) {
  console.error(`  FAILED: ${failed}`);
  process.exit(1);
}
console.log(`  passed in Chromium (${lines.length} console lines)`);
