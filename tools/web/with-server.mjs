// Runs a command with a real mpush-server started for it:
//   node tools/web/with-server.mjs -- cargo test ...
// The command gets MPUSH_TEST_WS (ws:// URL) and MPUSH_TEST_API (http:// URL).
// The server allows CORS from any origin (test pages are served elsewhere)
// and retries unacknowledged pushes quickly.
import { spawn } from "node:child_process";
import { startServer, root } from "./server.mjs";

const i = process.argv.indexOf("--");
const cmd = i >= 0 ? process.argv.slice(i + 1) : [];
if (cmd.length === 0) {
  console.error("usage: node with-server.mjs -- <command> [args...]");
  process.exit(2);
}
const server = await startServer({
  env: {
    MPUSH__SECURITY__CORS_ORIGINS: '["*"]',
    MPUSH__DELIVERY__ACK_WAITS_MS: "[300,300,300]",
  },
});
console.log(`with-server: mpush-server at ${server.wsUrl} and ${server.apiUrl}`);
const child = spawn(cmd[0], cmd.slice(1), {
  cwd: root,
  stdio: "inherit",
  env: { ...process.env, MPUSH_TEST_WS: server.wsUrl, MPUSH_TEST_API: server.apiUrl },
});
const code = await new Promise((resolve) => child.on("exit", (c, sig) => resolve(c ?? (sig ? 1 : 0))));
await server.stop();
process.exit(code);
