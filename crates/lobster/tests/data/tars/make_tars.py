"""Writes the tar fixtures of crates/lobster/tests/shards.rs with Python's tarfile (an
independent writer):

- wds-{0..1}.tar: webdataset layout (PAX format, tarfile's default), 3 samples each, keys
  shard-major; sample 1 of shard 0 has a 150-character key (a pax path header).
- gnu.tar: GNU format with a long name (a GNU 'L' header) and a directory entry.
- out_of_order.tar: members of two samples interleaved (a.jpg, b.jpg, b.cls, a.cls).
- split-{0..1}.tar: key "k2" in both shards.
- dup.tar: a member twice. no_label.tar: a sample without .cls.
- json.tar: labels from .json members ({"cls": n}, {"label": n}, and .cls beside .json,
  which wins). json_bad.tar: a .json member without either field.

Run: python3 crates/lobster/tests/data/tars/make_tars.py (deterministic: fixed mtimes, owners and bytes).
"""

import io
import json
import os
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))


def payload(key, n):
    return bytes((i * 7 + len(key)) % 256 for i in range(n))


def write(name, members, fmt=tarfile.PAX_FORMAT, dirs=()):
    with tarfile.open(os.path.join(HERE, name), "w", format=fmt) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mtime = 1700000000
            tar.addfile(info)
        for path, data in members:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = 1700000000
            info.uname = info.gname = "lobster"
            tar.addfile(info, io.BytesIO(data))


def sample(key, label, n):
    return [(key + ".jpg", payload(key, n)), (key + ".cls", str(label).encode())]


long_key = "deep/" + "x" * 140 + "/s1"
write("wds-0.tar", sample("s0", 0, 700) + sample(long_key, 1, 1500) + sample("s2", 2, 33))
write("wds-1.tar", sample("s3", 1, 4096) + sample("s4", 0, 1) + sample("s5", 2, 513))
write(
    "gnu.tar",
    sample("g/" + "y" * 120, 0, 300) + sample("g/short", 1, 301),
    fmt=tarfile.GNU_FORMAT,
    dirs=["g"],
)
a, b = sample("a", 0, 100), sample("b", 1, 200)
write("out_of_order.tar", [a[0], b[0], b[1], a[1]])
write("split-0.tar", sample("k1", 0, 10) + [sample("k2", 1, 10)[0]])
write("split-1.tar", [sample("k2", 1, 10)[1]] + sample("k3", 0, 10))
write("dup.tar", sample("d", 0, 10) + [sample("d", 0, 10)[0]])
write("no_label.tar", sample("n1", 0, 10) + [sample("n2", 0, 10)[0]])


def with_json(key, meta, n):
    return [(key + ".jpg", payload(key, n)), (key + ".json", json.dumps(meta).encode())]


write(
    "json.tar",
    with_json("j0", {"cls": 2, "caption": "a"}, 40)
    + with_json("j1", {"label": 1}, 41)
    + with_json("j2", {"cls": 0}, 42)[:1]
    + [("j2.cls", b"3"), ("j2.json", b'{"cls": 0}')],
)
write("json_bad.tar", with_json("b0", {"name": "x"}, 10))
print("written")


def listing(name):
    """Each sample's key, its image member's data offset and size, and its label, from
    tarfile reading the archive back: the offsets are tarfile's, not ours."""
    out = {}
    with tarfile.open(os.path.join(HERE, name)) as tar:
        for m in tar.getmembers():
            if not m.isreg():
                continue
            key, ext = m.name.rsplit("/", 1)[0] + "/" if "/" in m.name else "", m.name.rsplit("/", 1)[-1]
            base, ext = ext.split(".", 1)
            key += base
            s = out.setdefault(key, {})
            if ext == "cls":
                s["label"] = int(tar.extractfile(m).read())
            elif ext == "json":
                meta = json.loads(tar.extractfile(m).read())
                s.setdefault("json_label", meta.get("cls", meta.get("label")))
            else:
                s["offset"], s["size"] = m.offset_data, m.size
    return [[k, v["offset"], v["size"], v.get("label", v.get("json_label"))] for k, v in out.items()]


with open(os.path.join(HERE, "listing.json"), "w") as f:
    json.dump(
        {n: listing(n) for n in ["wds-0.tar", "wds-1.tar", "gnu.tar", "out_of_order.tar", "json.tar"]},
        f,
        indent=1,
    )
    f.write("\n")
