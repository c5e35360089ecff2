"""A generator of the 19 CIFAR-100-C corruption types at 5 severities, for any image dataset.

Hendrycks and Dietterich (2019), https://arxiv.org/abs/1903.12261, corrupt test sets with 15 + 4 corruption
types. This module re-implements the same *types* with numpy/scipy/PIL only (no ImageMagick, no OpenCV, no
stored frost photos: frost is a procedural ice texture), so shifted test sets can be made where the official
release cannot be downloaded (e.g. CIFAR-10-C). The images are therefore not bit-identical to the release;
use ``sve.data.cifar_c`` for the official CIFAR-100-C files.

Design:
- Spatial parameters (blur radii, displacement sizes, noise scales) are given for 32-px images and scaled
  by ``min(H, W) / 32``, so one table serves CIFAR and 500-px Flowers images.
- Each corruption draws its random fields *before* applying the severity, from a generator seeded with
  (seed, corruption, image index); so the result is deterministic per seed, and a higher severity scales
  the same random field, which makes the distortion grow monotonically with severity.
- Functions take and return float arrays (H, W, 3) in [0, 1].
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image
from scipy import ndimage, signal

from sve.errors import InputError

Array = np.ndarray
Rng = np.random.Generator

CORRUPTIONS = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "speckle_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "gaussian_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "saturate",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
    "spatter",
)
SEVERITIES = (1, 2, 3, 4, 5)


def _scale(x: Array) -> float:
    return min(x.shape[:2]) / 32


def _blur(x: Array, sigma: float) -> Array:
    """Gaussian blur of the two spatial axes only."""
    return ndimage.gaussian_filter(x, sigma=(sigma, sigma, 0), mode="reflect") if sigma > 0 else x


def _convolve(x: Array, kernel: Array) -> Array:
    """Per-channel 2-D convolution with reflect padding (FFT, so large kernels on large images stay cheap)."""
    kernel = kernel / kernel.sum()
    ph, pw = kernel.shape[0] // 2, kernel.shape[1] // 2
    padded = np.pad(x, ((ph, ph), (pw, pw), (0, 0)), mode="reflect")
    out = np.stack([signal.fftconvolve(padded[..., c], kernel, mode="valid") for c in range(3)], -1)
    return out[: x.shape[0], : x.shape[1]]


def _smooth_noise(rng: Rng, shape: tuple[int, int], sigma: float) -> Array:
    """Gaussian noise low-passed by a Gaussian of std ``sigma`` and standardised: a cloud-like field."""
    field = ndimage.gaussian_filter(rng.standard_normal(shape), sigma)
    return (field - field.mean()) / (field.std() + 1e-8)


def _hsv(x: Array) -> Array:
    return np.asarray(Image.fromarray(_to_uint8(x)).convert("HSV"), dtype=np.float64) / 255


def _from_hsv(hsv: Array) -> Array:
    return np.asarray(Image.fromarray(_to_uint8(hsv), "HSV").convert("RGB"), dtype=np.float64) / 255


def _to_uint8(x: Array) -> Array:
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


# --- noise ------------------------------------------------------------------------------------------------
def gaussian_noise(x, s, rng):
    return x + [0.04, 0.06, 0.08, 0.10, 0.13][s - 1] * rng.standard_normal(x.shape)


def shot_noise(x, s, rng):
    # Poisson photon noise, written as a standardised draw so the same draw serves every severity.
    photons = [500, 250, 100, 60, 30][s - 1]
    return x + np.sqrt(np.maximum(x, 0) / photons) * rng.standard_normal(x.shape)


def impulse_noise(x, s, rng):
    u, salt = rng.random(x.shape), rng.random(x.shape) < 0.5
    hit = u < [0.01, 0.02, 0.04, 0.06, 0.09][s - 1]  # nested masks: a higher severity adds pixels
    return np.where(hit, salt.astype(float), x)


def speckle_noise(x, s, rng):
    return x + x * [0.06, 0.10, 0.14, 0.18, 0.24][s - 1] * rng.standard_normal(x.shape)


# --- blur -------------------------------------------------------------------------------------------------
def gaussian_blur(x, s, rng):
    return _blur(x, [0.4, 0.6, 0.8, 1.0, 1.4][s - 1] * _scale(x))


def defocus_blur(x, s, rng):
    radius = [0.8, 1.1, 1.4, 1.8, 2.4][s - 1] * _scale(x)
    r = int(np.ceil(radius)) + 1
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    # An anti-aliased aperture (disk): pixel weight falls from 1 to 0 across the rim, so every radius differs.
    disk = np.clip(radius + 0.5 - np.sqrt(xx**2 + yy**2), 0, 1)
    return _convolve(x, disk)


def glass_blur(x, s, rng):
    # Blur, move every pixel to a random nearby position ("frosted glass"), blur again. The displacement
    # field is drawn once in [-1, 1] and stretched by the severity's maximum displacement.
    reach = [0.7, 1.0, 1.4, 1.8, 2.4][s - 1] * _scale(x)
    sigma = 0.4 * _scale(x)
    h, w = x.shape[:2]
    u = rng.uniform(-1, 1, size=(2, h, w))
    rows, cols = np.mgrid[0:h, 0:w]
    r = np.clip(rows + np.rint(u[0] * reach).astype(int), 0, h - 1)
    c = np.clip(cols + np.rint(u[1] * reach).astype(int), 0, w - 1)
    return _blur(_blur(x, sigma)[r, c], sigma)


def motion_blur(x, s, rng):
    length = [3, 5, 7, 9, 12][s - 1] * _scale(x)
    angle = rng.uniform(-np.pi / 4, np.pi / 4)
    n = int(np.ceil(length)) | 1
    kernel = np.zeros((n, n))
    for t in np.linspace(0, length - 1, 4 * n):  # a line from the centre backwards: blur trails one way
        kernel[int(round(n // 2 - t * np.sin(angle) / 2)), int(round(n // 2 - t * np.cos(angle) / 2))] = 1
    return _convolve(x, kernel)


def zoom_blur(x, s, rng):
    top = [1.06, 1.11, 1.16, 1.21, 1.28][s - 1]
    h, w = x.shape[:2]
    acc = x.copy()
    zooms = np.arange(1.0, top, 0.01)[1:]
    for z in zooms:  # average of the image zoomed about its centre by every factor up to `top`
        zoomed = ndimage.zoom(x, (z, z, 1), order=1)
        top_r, top_c = (zoomed.shape[0] - h) // 2, (zoomed.shape[1] - w) // 2
        acc += zoomed[top_r : top_r + h, top_c : top_c + w]
    return acc / (len(zooms) + 1)


# --- weather ----------------------------------------------------------------------------------------------
def snow(x, s, rng):
    density, length, veil = [(0.04, 3, 0.1), (0.07, 5, 0.2), (0.10, 7, 0.3), (0.13, 9, 0.4), (0.17, 11, 0.5)][s - 1]
    h, w = x.shape[:2]
    u = rng.random((h, w))
    flakes = (u < density).astype(float)[..., None].repeat(3, -1)
    streaks = np.clip(motion_blur(flakes, 1, rng) * length, 0, 1)  # falling flakes leave short streaks
    gray = x.mean(-1, keepdims=True) * 1.5 + 0.5
    base = (1 - veil) * x + veil * np.maximum(x, gray)  # a whitish veil over the scene
    return np.maximum(base, streaks * min(1.0, 0.4 + veil))


def frost(x, s, rng):
    keep, ice = [(1.0, 0.25), (0.95, 0.35), (0.9, 0.45), (0.85, 0.5), (0.75, 0.6)][s - 1]
    sc = _scale(x)
    # Ice crystals: ridges (|noise| near zero) of noise at two scales, bluish-white.
    ridges = 1 - np.abs(_smooth_noise(rng, x.shape[:2], 1.0 * sc) + 0.5 * _smooth_noise(rng, x.shape[:2], 3 * sc))
    texture = np.clip(ridges, 0, 1)[..., None] * np.array([0.85, 0.9, 1.0])
    return keep * x + ice * texture


def _plasma(rng: Rng, size: int, decay: float) -> Array:
    """A fractal cloud in [0, 1] (sum of octaves of smooth noise, amplitudes shrinking by ``decay``)."""
    field, amp, sigma = np.zeros((size, size)), 1.0, size / 4
    while sigma >= 0.5:
        field += amp * _smooth_noise(rng, (size, size), sigma)
        amp, sigma = amp / decay, sigma / 2
    return (field - field.min()) / (np.ptp(field) + 1e-8)


def fog(x, s, rng):
    strength, decay = [(0.25, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.4, 1.75)][s - 1]
    h, w = x.shape[:2]
    cloud = _plasma(rng, max(h, w), decay)[:h, :w, None]
    peak = x.max()
    return (x + strength * cloud) * peak / (peak + strength)


# --- digital ----------------------------------------------------------------------------------------------
def brightness(x, s, rng):
    hsv = _hsv(x)
    hsv[..., 2] = np.clip(hsv[..., 2] + [0.1, 0.2, 0.3, 0.4, 0.5][s - 1], 0, 1)
    return _from_hsv(hsv)


def contrast(x, s, rng):
    mean = x.mean(axis=(0, 1), keepdims=True)
    return (x - mean) * [0.75, 0.5, 0.4, 0.3, 0.15][s - 1] + mean


def saturate(x, s, rng):
    factor, shift = [(1.5, 0.0), (2.0, 0.0), (3.0, 0.05), (5.0, 0.1), (10.0, 0.2)][s - 1]
    hsv = _hsv(x)
    hsv[..., 1] = np.clip(hsv[..., 1] * factor + shift, 0, 1)
    return _from_hsv(hsv)


def elastic_transform(x, s, rng):
    alpha, sigma = [(1.0, 4.0), (2.0, 4.0), (3.0, 3.5), (4.0, 3.0), (5.5, 3.0)][s - 1]
    sc = _scale(x)
    h, w = x.shape[:2]
    # Smooth random displacement fields (pixels), scaled with the image size.
    dy = _smooth_noise(rng, (h, w), sigma * sc) * alpha * sc
    dx = _smooth_noise(rng, (h, w), sigma * sc) * alpha * sc
    rows, cols = np.mgrid[0:h, 0:w].astype(float)
    coords = [rows + dy, cols + dx]
    return np.stack([ndimage.map_coordinates(x[..., c], coords, order=1, mode="reflect") for c in range(3)], -1)


def pixelate(x, s, rng):
    factor = [0.8, 0.6, 0.5, 0.4, 0.3][s - 1]
    image = Image.fromarray(_to_uint8(x))
    w, h = image.size
    small = image.resize((max(1, int(w * factor)), max(1, int(h * factor))), Image.BOX)
    return np.asarray(small.resize((w, h), Image.BOX), dtype=np.float64) / 255


def jpeg_compression(x, s, rng):
    buffer = io.BytesIO()
    Image.fromarray(_to_uint8(x)).save(buffer, "JPEG", quality=[70, 50, 35, 20, 10][s - 1])
    return np.asarray(Image.open(buffer).convert("RGB"), dtype=np.float64) / 255


def spatter(x, s, rng):
    cover, opacity = [(0.05, 0.5), (0.10, 0.6), (0.16, 0.7), (0.22, 0.8), (0.30, 0.9)][s - 1]
    sc = _scale(x)
    field = _smooth_noise(rng, x.shape[:2], 1.5 * sc)
    # Drops: the top `cover` fraction of a cloud field (nested as severity grows), softened at the edges.
    level = np.quantile(field, 1 - cover)
    drops = np.clip((field - level) * 4, 0, 1)[..., None]
    mud = np.array([0.40, 0.30, 0.20])
    return x * (1 - opacity * drops) + mud * opacity * drops


FUNCTIONS: dict[str, Callable[[Array, int, Rng], Array]] = {name: globals()[name] for name in CORRUPTIONS}


def corrupt(image: Array | Image.Image, corruption: str, severity: int, seed: int = 0, index: int = 0) -> Array:
    """Corrupts one image; returns uint8 (H, W, 3). Same (seed, index) -> same output."""
    if corruption not in FUNCTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {list(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {list(SEVERITIES)}, got {severity!r}")
    x = np.asarray(Image.fromarray(image) if isinstance(image, np.ndarray) else image, dtype=np.uint8)
    if x.ndim == 2:
        x = np.repeat(x[..., None], 3, -1)
    rng = np.random.default_rng([seed, CORRUPTIONS.index(corruption), index])
    return _to_uint8(FUNCTIONS[corruption](x.astype(np.float64) / 255, severity, rng))


def choose(value, allowed: tuple, key: str) -> list:
    """A config value (one entry, a list, or ``all``/None for every entry) as a list of allowed entries."""
    values = list(allowed) if value in (None, "all") else [value] if isinstance(value, (str, int)) else list(value)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise InputError(f"dataset.{key} has unknown entries {bad}; choose from {list(allowed)}")
    return values


class Corrupter:
    """Callable ``(PIL image, index) -> PIL image`` for ``sve.data.vision.Transformed``."""

    def __init__(self, corruption: str, severity: int, seed: int = 0):
        corrupt(np.zeros((4, 4, 3), np.uint8), corruption, severity)  # validates the names early
        self.corruption, self.severity, self.seed = corruption, severity, seed

    def __call__(self, image: Image.Image, index: int) -> Image.Image:
        return Image.fromarray(corrupt(image, self.corruption, self.severity, self.seed, index))


__all__ = ["CORRUPTIONS", "SEVERITIES", "corrupt", "choose", "Corrupter"]
