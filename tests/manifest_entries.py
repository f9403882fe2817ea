"""Hostile shard entries in manifest files (issue #25 item 2), as a table: the tests
(``tests/dataset/test_manifest_entries.py``) and the attack script (``benchmarks/hostile_manifests.py``) both run
it, against the same sandbox (:func:`make_sandbox`).

An entry is a template: ``{outside}`` is a directory beside the manifest's (holding ``outside.beton``, a real shard,
and ``secret``, a FIFO: opening it for reading blocks until a writer comes, so a client that opens it hangs),
``{other}`` the URL of a second loopback server serving ``{outside}``. Each case gives the words its refusal must
contain.
"""

from __future__ import annotations

import json
import os

import beton
from beton.fields import IntField

#: name -> (entry template, words of the refusal). Refused in a local manifest and in one at a URL.
EVERYWHERE = {
    "simplecache chain": ("simplecache::{outside}/secret", "chained URL"),
    "blockcache chain": ("blockcache::{outside}/secret", "chained URL"),
    "filecache chain": ("filecache::{outside}/secret", "chained URL"),
    "tar chain": ("tar://x.beton::{outside}/a.tar", "chained URL"),
    "zip chain": ("zip://x.beton::{outside}/a.zip", "chained URL"),
    "zip unchained": ("zip://x.beton", "zip://, which opens other files"),
    "simplecache unchained": ("simplecache://{outside}/secret", "simplecache://, which opens other files"),
    "file URL": ("file://{outside}/secret", "names a file of this machine"),
    "file URL /etc/passwd": ("file:///etc/passwd", "names a file of this machine"),
    "dot-dot": ("../outside/outside.beton", "outside the manifest's directory"),
    "encoded dot-dot": ("%2e%2e/outside/outside.beton", "outside the manifest's directory"),
    "encoded dot-dot below a folder": ("sub/%2e%2e/%2e%2e/outside/secret", "outside the manifest's directory"),
    "double-encoded dot-dot": ("%252e%252e/outside/secret", "outside the manifest's directory"),
    "encoded backslash": ("..%5coutside%5csecret", "outside the manifest's directory"),
    "backslash": ("..\\outside\\secret", "backslash"),
    "another server": ("{other}/outside.beton", "outside the manifest's directory"),
}
#: Refused in a local manifest (a local manifest names local files in its directory).
LOCAL = {
    "absolute path outside": ("{outside}/secret", "outside the manifest's directory"),
    "/etc/passwd": ("/etc/passwd", "outside the manifest's directory"),
}
#: Refused in a manifest at a URL (it names shards on its own store only).
REMOTE = {
    "local path": ("{outside}/secret", "is a local path"),
    "/etc/passwd": ("/etc/passwd", "is a local path"),
    "query": ("part-0.beton?file=../outside/secret", "query or fragment"),
}


def make_sandbox(root: str) -> dict[str, str]:
    """``root/data`` (shards ``part-0.beton``, ``sub/part-1.beton``, ``part-2.beton``; ``train.json`` lists the first
    two) and ``root/outside``
    (``outside.beton``, the FIFO ``secret``, ``passwd``: a text file). Returns the paths by name."""
    data, outside = os.path.join(root, "data"), os.path.join(root, "outside")
    os.makedirs(os.path.join(data, "sub"))
    os.makedirs(outside)
    for path, start in ((os.path.join(data, "part-0.beton"), 0), (os.path.join(data, "sub", "part-1.beton"), 3),
                        (os.path.join(data, "part-2.beton"), 6), (os.path.join(outside, "outside.beton"), 9)):
        beton.DatasetWriter(path, {"label": IntField()}, num_workers=0, progress=False).from_indexed_dataset(
            [(i,) for i in range(start, start + 3)])
    os.mkfifo(os.path.join(outside, "secret"))
    with open(os.path.join(outside, "passwd"), "w") as file:
        file.write("root:x:0:0:root:/root:/bin/bash\n")
    from beton.dataset.shards import index

    index(os.path.join(data, "train.json"), [os.path.join(data, "part-0.beton"),
                                             os.path.join(data, "sub", "part-1.beton")])
    return {"data": data, "outside": outside, "manifest": os.path.join(data, "train.json"),
            "outside_shard": os.path.join(outside, "outside.beton")}


def hostile_manifest(sandbox: dict[str, str], entry: str, name: str = "hostile.json") -> str:
    """A copy of the sandbox's manifest, in its directory, whose first shard is listed as ``entry``; its path."""
    with open(sandbox["manifest"]) as file:
        document = json.load(file)
    document["shards"][0]["path"] = entry
    path = os.path.join(sandbox["data"], name)
    with open(path, "w") as file:
        json.dump(document, file)
    return path
