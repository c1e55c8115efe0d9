"""The Python package (the wheel `mpush-sdk`, installed in a fresh venv by
scripts/test-mobile) against a real mpush-server (started by
tools/web/with-server.mjs --redis): the shared protocol vectors and error
table, connect, bind, receive a push, ACK it, up-push, reconnect after a
server restart by fast connect with the stored ticket, and no SDK thread
left after shutdown().

Run: <venv>/bin/python test_bindings.py          (the installed wheel), or
     python3 test_bindings.py <bindings/python>   (the loose generated module).
"""
import asyncio
import json
import os
import pathlib
import sys
import traceback
import urllib.request

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
import mpush_sdk_mobile as m  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f" {detail}"))


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return json.loads(text) if text.startswith("{") else text


def sdk_threads():
    n = 0
    for t in pathlib.Path("/proc/self/task").iterdir():
        try:
            n += (t / "comm").read_text().strip() == "mpush-sdk"
        except OSError:
            pass
    return n


class DictStore(m.SessionStore):
    """The app's ticket store (Keychain, SharedPreferences...)."""

    def __init__(self):
        self.ticket = None

    def load(self):
        return self.ticket

    def save(self, ticket):
        self.ticket = ticket or None


def vectors():
    names = [m.check_vector(p.read_text()) for p in sorted((ROOT / "protocol/testdata/vectors").glob("*.json"))]
    check(f"every shared protocol vector matches ({len(names)})", len(names) >= 20 and "v2_keys" in names and "token_dat" in names, names)
    try:
        m.check_vector('{"name": "x", "kind": "packet", "hex": "00", "fields": {}}')
        check("a broken vector is an error", False)
    except m.PushError.InvalidInput as e:
        check("a broken vector is an error with code invalid_input", e.code() == "invalid_input", e)


def error_table():
    """The one (error, code) table of every SDK: sdk-core/testdata/error-codes.json."""
    rows = json.loads((ROOT / "sdk-core/testdata/error-codes.json").read_text())["errors"]
    errors = m.error_table()
    got = [(e.code(), e.retryable()) for e in errors]
    want = [(r["code"], r["retryable"]) for r in rows]
    check(f"every error kind has the shared code and retryable flag ({len(want)})", got == want, got)


async def expect(client, what, pick, timeout=15.0):
    async def loop():
        while True:
            e = await client.next_event()
            if e is None:
                raise AssertionError(f"the client stopped while waiting for {what}")
            got = pick(e)
            if got is not None:
                return got

    try:
        return await asyncio.wait_for(loop(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def wait_trace(api, trace, state):
    for _ in range(100):
        t = http("GET", f"{api}/api/v1/traces/{trace}")
        if t.get("state") == state:
            return True
        await asyncio.sleep(0.05)
    return False


async def online():
    tcp, api, control = os.environ["MPUSH_TEST_TCP"], os.environ["MPUSH_TEST_API"], os.environ["MPUSH_TEST_CONTROL"]
    user = f"python-{os.getpid()}"
    store = DictStore()
    config = m.PushConfig(servers=[tcp], device_id=f"{user}-1", os_name="ios", backoff_initial_ms=300, backoff_max_ms=1000)
    client = m.PushClient(config, store, None)
    client.connect()
    c = await expect(client, "connected", lambda e: e if e.is_connected() else None)
    check("connected over TCP with the v2 profile", c.v2 and not c.resumed, c)
    await client.bind(user, ["py"], None)
    check("bind returns once the server accepted it", http("GET", f"{api}/api/v1/users/{user}")["online"])
    check("state() says connected", client.state() == m.ConnectionState.CONNECTED, client.state())
    r = http("POST", f"{api}/api/v1/push", {"userId": user, "content": "hello python", "ackMode": "biz"})
    msg = await expect(client, "the push", lambda e: e.message if e.is_message() else None)
    check("a push arrives", msg.content == b"hello python" and msg.needs_ack and msg.trace_id == r["traceId"], msg)
    client.ack(msg.id)
    check("the ACK reaches the server (trace ACK)", await wait_trace(api, r["traceId"], "ACK"))
    await client.push("up from python ✓".encode(), True)
    hooked = http("GET", f"{control}/webhook/events")
    mine = [e for e in hooked["events"] if e.get("userId") == user and e.get("type") == "up_push"]
    check("the up-push arrived at the webhook, exactly as sent", [e["content"] for e in mine] == ["up from python ✓"], hooked)
    check("every webhook signature verified", hooked["badSignatures"] == 0, hooked)
    check("the resume ticket is in the app's store", (store.ticket or "").startswith("v2,"), store.ticket)

    http("POST", f"{control}/restart")
    await expect(client, "disconnected", lambda e: e if e.is_disconnected() else None)
    c2 = await expect(client, "reconnected", lambda e: e if e.is_connected() else None, timeout=20)
    check("after a server restart: fast connect with the stored ticket", c2.resumed, c2)
    await expect(client, "re-bound", lambda e: e if e.is_bound() else None)
    http("POST", f"{api}/api/v1/push", {"userId": user, "content": "after restart", "ackMode": "auto"})
    msg2 = await expect(client, "the push after the restart", lambda e: e.message if e.is_message() else None)
    check("re-bound and receiving after the restart", msg2.content == b"after restart")

    check("an SDK thread runs", sdk_threads() >= 1)
    client.shutdown()
    rest = await asyncio.wait_for(client.next_event(), 5)
    while rest is not None:
        rest = await asyncio.wait_for(client.next_event(), 5)
    check("shutdown(): next_event ends", True)
    check("no SDK thread left after shutdown()", sdk_threads() == 0, sdk_threads())
    check("state() says closed", client.state() == m.ConnectionState.CLOSED, client.state())
    try:
        await client.push(b"x", False)
        check("a stopped client refuses calls", False)
    except m.PushError.Stopped as e:
        check("a stopped client refuses calls (code stopped)", e.code() == "stopped")


def main():
    try:
        check(f"the library loads (sdk {m.sdk_version()}) from {pathlib.Path(m.__file__).parent}", bool(m.sdk_version()))
        vectors()
        error_table()
        if os.environ.get("MPUSH_TEST_TCP"):
            asyncio.run(online())
        else:
            print("skip online tests: run through tools/web/with-server.mjs --redis")
    except Exception:
        results["failed"] += 1
        print("FAIL " + traceback.format_exc())
    print(f"python: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


main()
