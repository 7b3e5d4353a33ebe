#!/usr/bin/env python3
"""Photographs for the region decode tests, from scikit-image's sample images (public
domain or CC0: astronaut, coffee, chelsea), saved by Pillow. Run from this folder:
python3 make_photos.py (scikit-image and Pillow installed)."""

from PIL import Image
from skimage import data

# name, source, size, quality, subsampling (Pillow: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0), extra
PHOTOS = [
    ("photo-astronaut-420.jpg", data.astronaut, (512, 512), 90, 2, {}),
    ("photo-coffee-420.jpg", data.coffee, (600, 400), 85, 2, {}),
    ("photo-chelsea-444.jpg", data.chelsea, (451, 300), 92, 0, {}),
    ("photo-coffee-422.jpg", data.coffee, (375, 250), 80, 1, {}),
    ("photo-astronaut-restart.jpg", data.astronaut, (333, 333), 88, 2, {"restart_marker_rows": 1}),
    ("photo-chelsea-progressive.jpg", data.chelsea, (300, 200), 85, 2, {"progressive": True}),
]

for name, source, size, quality, subsampling, extra in PHOTOS:
    image = Image.fromarray(source()).convert("RGB").resize(size, Image.LANCZOS)
    image.save(name, quality=quality, subsampling=subsampling, **extra)
    print(name, size, quality, subsampling, extra)
