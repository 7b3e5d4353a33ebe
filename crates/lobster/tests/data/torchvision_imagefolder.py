"""Writes torchvision_imagefolder.json: what torchvision's ImageFolder makes of the fixture
tree in imagefolder_tree.json (classes, their indices, and every sample in order, paths
relative to the root), and the error it raises when classes have no valid file.

Run from anywhere with torchvision installed:
    python3 crates/lobster/tests/data/torchvision_imagefolder.py
"""

import json
import os
import sys
import tempfile

import torchvision
from torchvision.datasets import ImageFolder

HERE = os.path.dirname(os.path.abspath(__file__))


def build(root, spec):
    for f in spec.get("files", []):
        path = os.path.join(root, f["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(bytes(i % 251 for i in range(f["bytes"])))
    for d in spec.get("dirs", []):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for link in spec.get("symlinks", []):
        path = os.path.join(root, link["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(link["target"], path)


def main():
    with open(os.path.join(HERE, "imagefolder_tree.json")) as f:
        spec = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(root)
        build(root, spec)
        # The loader is never called: the listing is what ImageFolder indexes.
        ds = ImageFolder(root, loader=lambda path: path)
        listing = {
            "provenance": (
                f"torchvision {torchvision.__version__} ImageFolder on the tree of "
                "imagefolder_tree.json, written by torchvision_imagefolder.py"
            ),
            "python": sys.version.split()[0],
            "classes": ds.classes,
            "class_to_idx": ds.class_to_idx,
            "samples": [[os.path.relpath(p, root), c] for p, c in ds.samples],
        }
        build(root, spec["empty_classes"])
        try:
            ImageFolder(root, loader=lambda path: path)
            raise SystemExit("torchvision accepted classes without a valid file")
        except FileNotFoundError as e:
            listing["empty_classes_error"] = str(e)
    out = os.path.join(HERE, "torchvision_imagefolder.json")
    with open(out, "w") as f:
        json.dump(listing, f, indent=1)
        f.write("\n")
    print(f"wrote {out}: {len(listing['samples'])} samples in {len(listing['classes'])} classes")


if __name__ == "__main__":
    main()
