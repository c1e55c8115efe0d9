// Type-checked (tsc --strict --noEmit) against the packed package's .d.ts:
// the API a web developer writes against must type as documented.
import init, { PushClient, version } from "mpush-sdk";
import type { PushClientOptions, PushEvent, PushMessage, PushError, ConnectionState, StateDetail } from "mpush-sdk";

export async function example(): Promise<void> {
  await init();
  const options: PushClientOptions = {
    servers: ["ws://127.0.0.1:8088/"],
    backoff: { initialMs: 500, maxMs: 30000 },
    storage: null,
    onMessage: (m: PushMessage) => {
      const text: string = m.text;
      const id: number = m.id;
      const serverId: string | null = m.messageId;
      if (m.needsAck) client.ack(m);
      client.ack(id);
      void text;
      void serverId;
    },
    onStateChange: (s: ConnectionState, d: StateDetail) => void [s, d.retryInMs],
    onError: (e: PushError) => void e.code,
  };
  const client = new PushClient(options);
  client.onKicked = (k) => void k.userId;
  await client.connect();
  await client.bind("user-1", { tags: ["vip"], token: "t" });
  await client.bind("user-1");
  await client.push("hello");
  await client.push(new Uint8Array([1, 2]), { ack: false });
  for await (const e of client.events()) {
    const ev: PushEvent = e;
    switch (ev.type) {
      case "message":
        console.log(ev.message.text);
        break;
      case "state":
        console.log(ev.state, ev.detail.reason);
        break;
      case "kicked":
        console.log(ev.userId, ev.deviceId);
        break;
      case "bound":
        console.log(ev.userId);
        break;
      case "error":
        console.log(ev.error.code);
        break;
    }
  }
  const s: ConnectionState = client.state;
  const v: string = version();
  client.close();
  void [s, v];
}

// @ts-expect-error servers must be strings
new PushClient({ servers: [1] });
// @ts-expect-error unknown state names do not type
const bad: ConnectionState = "online";
void bad;
