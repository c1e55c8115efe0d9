"""The conformance kit's adapter for the Python package (the wheel
`mpush-sdk`):

    mpush-conformance client --label python -- <venv>/bin/python conformance_adapter.py

It speaks the kit's contract (conformance/README.md): the connection from
MPUSH_CONFORMANCE_* variables, what the application sees as JSON lines on
stdout, a message that needs an ACK acknowledged after it was printed.
"""
import asyncio
import json
import os
import sys

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
import mpush_sdk_mobile as m  # noqa: E402


def env(k):
    return os.environ.get("MPUSH_CONFORMANCE_" + k, "")


def say(o):
    print(json.dumps(o), flush=True)


class MemoryStore(m.SessionStore):
    """The resume ticket, for as long as the process lives."""

    def __init__(self):
        self.ticket = None

    def load(self):
        return self.ticket

    def save(self, ticket):
        self.ticket = ticket or None


async def main():
    config = m.PushConfig(servers=[env("SERVER")], device_id=env("DEVICE"), public_key=env("PUBLIC_KEY") or None)
    client = m.PushClient(config, MemoryStore(), None)
    client.connect()
    user = env("USER")
    binding = None

    async def bind():
        try:
            await client.bind(user, [], None)
        except m.PushError as e:
            say({"event": "bind_failed", "userId": user, "reason": str(e)})

    while True:
        e = await client.next_event()
        if e is None or e.is_stopped():
            break
        if e.is_connected():
            say({"event": "connected", "resumed": e.resumed})
            if binding is None:
                binding = asyncio.ensure_future(bind())
        elif e.is_bound():
            say({"event": "bound", "userId": e.user_id})
        elif e.is_message():
            msg = e.message
            say({"event": "message", "text": msg.content.decode("utf-8", "replace"), "needsAck": msg.needs_ack})
            if msg.needs_ack:
                client.ack(msg.id)
        elif e.is_kicked():
            say({"event": "kicked", "deviceId": e.device_id})
        elif e.is_disconnected():
            say({"event": "disconnected", "retryInMs": e.retry_in_ms})


asyncio.run(main())
