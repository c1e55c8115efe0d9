#!/usr/bin/env python3
"""Lists a wasm module's imports and fails if any comes from module `env`.

House rule 1: the protocol core (and everything built on it for browsers)
must not import libc, OS randomness or a clock from `env`.
Usage: wasm_imports.py MODULE.wasm [--expect-export NAME]
"""
import sys


def leb(data, pos):
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, pos


def name(data, pos):
    n, pos = leb(data, pos)
    return data[pos:pos + n].decode("utf-8", "replace"), pos + n


def sections(data):
    if data[:4] != b"\0asm":
        raise SystemExit("not a wasm module")
    pos = 8
    while pos < len(data):
        sid = data[pos]
        size, pos = leb(data, pos + 1)
        yield sid, data[pos:pos + size]
        pos += size


def imports(data):
    for sid, body in sections(data):
        if sid != 2:
            continue
        count, pos = leb(body, 0)
        for _ in range(count):
            module, pos = name(body, pos)
            field, pos = name(body, pos)
            kind = body[pos]
            pos += 1
            if kind == 0:        # function: type index
                _, pos = leb(body, pos)
            elif kind == 1:      # table: reftype + limits
                pos += 1
                flag, pos = leb(body, pos)
                _, pos = leb(body, pos)
                if flag & 1:
                    _, pos = leb(body, pos)
            elif kind == 2:      # memory: limits
                flag, pos = leb(body, pos)
                _, pos = leb(body, pos)
                if flag & 1:
                    _, pos = leb(body, pos)
            elif kind == 3:      # global: valtype + mut
                pos += 2
            else:
                raise SystemExit(f"unknown import kind {kind}")
            yield module, field


def exports(data):
    for sid, body in sections(data):
        if sid != 7:
            continue
        count, pos = leb(body, 0)
        for _ in range(count):
            field, pos = name(body, pos)
            pos += 1
            _, pos = leb(body, pos)
            yield field


def main():
    path = sys.argv[1]
    data = open(path, "rb").read()
    found = list(imports(data))
    for module, field in found:
        print(f"import {module}.{field}")
    if "--expect-export" in sys.argv:
        want = sys.argv[sys.argv.index("--expect-export") + 1]
        if want not in set(exports(data)):
            raise SystemExit(f"FAIL: {path} does not export {want}: nothing was linked")
    bad = [f for m, f in found if m == "env"]
    if bad:
        raise SystemExit(f"FAIL: {path} imports from env: {bad}")
    print(f"ok: {path}: {len(found)} imports, none from env")


if __name__ == "__main__":
    main()
