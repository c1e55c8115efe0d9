// Prints the gzipped size of the package's wasm and JS (what a page downloads).
// Usage: node size.mjs <pkg dir> [--only prefix,...] [--json] [--max BYTES]
// --max: fail (exit 1) when the gzipped total is over BYTES (a size budget).
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

const pkg = process.argv[2];
const walk = (d) =>
  readdirSync(d).flatMap((f) => {
    const p = join(d, f);
    return statSync(p).isDirectory() ? walk(p) : [p];
  });
// --only a,b,c: count only files whose path (inside the package) starts with one of these.
const at = process.argv.indexOf("--only");
const only = at > 0 ? process.argv[at + 1].split(",") : null;
const shipped = walk(pkg)
  .filter((f) => /\.(wasm|js)$/.test(f))
  .filter((f) => !only || only.some((o) => f.slice(pkg.length + 1).startsWith(o)));
let raw = 0;
let gz = 0;
const rows = shipped.map((f) => {
  const b = readFileSync(f);
  const z = gzipSync(b, { level: 9 }).length;
  raw += b.length;
  gz += z;
  return { file: f.slice(pkg.length + 1), raw: b.length, gzip: z };
});
if (process.argv.includes("--json")) {
  console.log(JSON.stringify({ files: rows, raw, gzip: gz }));
} else {
  for (const r of rows) console.log(`${r.file.padEnd(36)} ${String(r.raw).padStart(8)} B  ${String(r.gzip).padStart(7)} B gzipped`);
  console.log(`${"total (wasm + JS)".padEnd(36)} ${String(raw).padStart(8)} B  ${String(gz).padStart(7)} B gzipped (${(gz / 1024).toFixed(1)} KiB)`);
}
const maxAt = process.argv.indexOf("--max");
if (maxAt > 0) {
  const max = Number(process.argv[maxAt + 1]);
  if (!(gz <= max)) {
    console.error(`over budget: ${gz} B gzipped > ${max} B`);
    process.exit(1);
  }
  console.log(`within the budget of ${max} B (${((100 * gz) / max).toFixed(0)} %)`);
}
