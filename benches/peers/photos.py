#!/usr/bin/env python3
"""A photo-like ImageFolder of JPEGs made from the colour photographs scikit-image ships.

    python benches/peers/photos.py [--out DIR] [--samples 4000] [--classes 10] [--seed 0]

The generated default set (`lobster gen`) is gradient plus noise at 4:4:4, which is not
what a camera makes and flatters some decoders. This set is cut from real photographs:
every image is a random crop (a random share of the photograph's area, a random aspect
ratio) of a photograph chosen at random, flipped at random, resized (Lanczos) to an
ImageNet-like shape and saved by Pillow as a baseline JPEG at a quality drawn uniformly
from 75 to 95 with 4:2:0 chroma. Shapes: the shorter side uniform in 200..500 pixels, the
longer side 1 to 4/3 times it, landscape three times in four (ImageNet's mean image is
about 400 x 350). The same seed gives the same files. Files are spread round-robin over
`--classes` folders named as `lobster gen` names them.

Only photographs inside the scikit-image wheel are used (no download): see PHOTOS. The
sources are small (300 x 451 to 1411 x 1411), so many outputs are upsampled from their crop;
upsampled pixels are smoother than a camera's, which makes the files smaller and somewhat
easier to decode than ImageNet's at the same shape. The script prints the scale factors.
"""

import argparse
import os
import random
import statistics
import sys

# Colour photographs of scikit-image's `skimage.data` that its wheel ships (no pooch
# download); drawings, synthetic images and greyscale pictures are left out.
PHOTOS = (
    "astronaut",  # portrait, 512 x 512
    "coffee",  # cup of coffee, 400 x 600
    "chelsea",  # cat, 300 x 451
    "rocket",  # rocket on its launch pad, 427 x 640
    "immunohistochemistry",  # stained tissue under a microscope, 512 x 512
    "hubble_deep_field",  # Hubble telescope, 872 x 1000
    "retina",  # fundus camera, 1411 x 1411, a black surround
    "motorcycle",  # stereo_motorcycle's left view, 500 x 741
)
SHORT = (200, 500)
ASPECT = (1.0, 4.0 / 3.0)
LANDSCAPE_P = 0.75
QUALITY = (75, 95)
CROP_AREA = (0.5, 1.0)  # share of the largest crop of the target aspect


def default_out():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lobster-io", "photos-4000-10-seed0")


def load_photos():
    import numpy as np
    from PIL import Image
    from skimage import data

    out = []
    for name in PHOTOS:
        a = data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(data, name)()
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] < 3:
            sys.exit("skimage.data.%s is not an 8-bit colour image: %s %s" %
                     (name, a.dtype, a.shape))
        out.append((name, Image.fromarray(np.ascontiguousarray(a[:, :, :3]))))
    return out


def make_one(photos, rng):
    """One image: (name of its photograph, PIL image, quality, upscale factor)."""
    from PIL import Image

    name, src = photos[rng.randrange(len(photos))]
    short = rng.randint(*SHORT)
    long_ = int(round(short * rng.uniform(*ASPECT)))
    w, h = (long_, short) if rng.random() < LANDSCAPE_P else (short, long_)
    # The largest crop of aspect w:h inside the photograph, then a random share of it.
    ar = w / h
    cw_max, ch_max = (src.width, src.width / ar) if src.width / ar <= src.height else (
        src.height * ar, src.height)
    k = rng.uniform(*CROP_AREA) ** 0.5
    cw, ch = cw_max * k, ch_max * k
    left = rng.uniform(0, src.width - cw)
    top = rng.uniform(0, src.height - ch)
    img = src.resize((w, h), Image.LANCZOS, box=(left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    quality = rng.randint(*QUALITY)
    return name, img, quality, w / cw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=default_out())
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.samples < 1 or not 1 <= args.classes <= args.samples:
        ap.error("need 1 <= --classes <= --samples")
    done = os.path.join(args.out, ".complete")
    if os.path.exists(done):
        print("%s exists (complete); remove it to make it again" % args.out)
        return

    import skimage
    from PIL import Image, features

    photos = load_photos()
    for c in range(args.classes):
        os.makedirs(os.path.join(args.out, "class%04d" % c), exist_ok=True)
    sizes, widths, heights, qualities, scales, used = [], [], [], [], [], {}
    for i in range(args.samples):
        # One generator per file, so that a file does not depend on the ones before it.
        rng = random.Random(args.seed * 1_000_003 + i)
        name, img, quality, scale = make_one(photos, rng)
        path = os.path.join(args.out, "class%04d" % (i % args.classes), "%08d.jpg" % i)
        img.save(path, "JPEG", quality=quality, subsampling=2, optimize=False,
                 progressive=False)
        sizes.append(os.path.getsize(path))
        widths.append(img.width)
        heights.append(img.height)
        qualities.append(quality)
        scales.append(scale)
        used[name] = used.get(name, 0) + 1
    open(done, "w").close()

    # Check one file: baseline, 4:2:0.
    from PIL import JpegImagePlugin

    with Image.open(os.path.join(args.out, "class0000", "%08d.jpg" % 0)) as im:
        sampling = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}.get(JpegImagePlugin.get_sampling(im))
        info = "%s %s %s, progressive %s" % (im.format, im.mode, sampling,
                                            bool(im.info.get("progressive")))
    print("wrote %d JPEGs in %d classes to %s" % (args.samples, args.classes, args.out))
    print("scikit-image %s, Pillow %s (libjpeg-turbo %s); sources: %s" % (
        skimage.__version__, Image.__version__ if hasattr(Image, "__version__") else "?",
        features.version("libjpeg_turbo"),
        ", ".join("%s %d" % (n, used.get(n, 0)) for n, _ in photos)))
    print("mean file %.1f KiB (median %.1f, %.1f to %.1f), total %.1f MiB" % (
        statistics.mean(sizes) / 1024, statistics.median(sizes) / 1024, min(sizes) / 1024,
        max(sizes) / 1024, sum(sizes) / 2**20))
    print("width %d to %d (mean %.0f), height %d to %d (mean %.0f)" % (
        min(widths), max(widths), statistics.mean(widths), min(heights), max(heights),
        statistics.mean(heights)))
    print("quality %d to %d (mean %.1f), 4:2:0, baseline; first file %s" % (
        min(qualities), max(qualities), statistics.mean(qualities), info))
    up = sum(1 for s in scales if s > 1.0)
    print("resize factor %.2f to %.2f (median %.2f); %d of %d upsampled" % (
        min(scales), max(scales), statistics.median(scales), up, len(scales)))


if __name__ == "__main__":
    main()
