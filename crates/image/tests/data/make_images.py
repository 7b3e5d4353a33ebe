"""Writes the decode fixtures of crates/image/tests/decode.rs with Pillow (an independent
encoder): flat 24x16 images of RGB (200, 100, 50), as a baseline JPEG, a grayscale JPEG, a
CMYK JPEG (Adobe marker, as Photoshop writes), a progressive JPEG, and PNGs in RGB, RGBA,
grayscale, 16-bit grayscale (124 * 257) and palette. Run with Pillow installed:
    python3 crates/image/tests/data/make_images.py
"""

import os

from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
RGB = (200, 100, 50)
SIZE = (24, 16)

rgb = Image.new("RGB", SIZE, RGB)
rgb.save(os.path.join(HERE, "rgb.jpg"), quality=95)
rgb.save(os.path.join(HERE, "progressive.jpg"), quality=95, progressive=True)
rgb.convert("L").save(os.path.join(HERE, "gray.jpg"), quality=95)
rgb.convert("CMYK").save(os.path.join(HERE, "cmyk.jpg"), quality=95)
rgb.save(os.path.join(HERE, "rgb.png"))
rgb.convert("RGBA").save(os.path.join(HERE, "rgba.png"))
rgb.convert("L").save(os.path.join(HERE, "gray.png"))
Image.new("I;16", SIZE, 124 * 257).save(os.path.join(HERE, "gray16.png"))
rgb.convert("P", palette=Image.ADAPTIVE).save(os.path.join(HERE, "palette.png"))
print("gray level", rgb.convert("L").getpixel((0, 0)))
