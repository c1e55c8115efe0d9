// The entry of one module of the package: the wasm core built for it
// (CORE is replaced by scripts/build-web) and the driver over it.
import init, * as core from "./CORE.js";
import { makeClient } from "./client.js";

export default init;
export const PushClient = makeClient(core);
export const version = core.version;
