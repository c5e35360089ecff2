"""The corruption generator: all 19 CIFAR-100-C types, shapes, range, determinism, severity monotonicity."""

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from sve.data.corruptions import CORRUPTIONS, SEVERITIES, Corrupter, corrupt


def _image(seed: int, size: int = 32) -> np.ndarray:
    """A natural-looking test image: structure at several scales (edges, textures, smooth shading)."""
    rng = np.random.default_rng(seed)
    x = sum(ndimage.gaussian_filter(rng.standard_normal((size, size, 3)), (s, s, 0)) * s for s in (0.7, 2, 5))
    return ((x - x.min()) / (x.max() - x.min()) * 255).astype(np.uint8)


IMAGES = [_image(i) for i in range(4)]


def test_the_19_types_of_cifar100_c():
    assert len(CORRUPTIONS) == 19 and len(set(CORRUPTIONS)) == 19
    assert {"gaussian_noise", "frost", "elastic_transform", "spatter", "saturate", "speckle_noise"} <= set(CORRUPTIONS)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_shape_dtype_range_and_determinism(name):
    image = _image(7, size=24)
    out = corrupt(image, name, 3, seed=1, index=5)
    assert out.shape == image.shape and out.dtype == np.uint8  # uint8: values in [0, 255] by construction
    np.testing.assert_array_equal(out, corrupt(image, name, 3, seed=1, index=5))
    assert not np.array_equal(out, image)
    gray = corrupt(image[..., 0], name, 3)  # grayscale input becomes RGB
    assert gray.shape == (24, 24, 3)


@pytest.mark.parametrize("name", ["gaussian_noise", "glass_blur", "fog", "spatter", "elastic_transform"])
def test_random_corruptions_depend_on_seed_and_index(name):
    image = _image(3)
    a = corrupt(image, name, 3, seed=0, index=0)
    assert not np.array_equal(a, corrupt(image, name, 3, seed=1, index=0))
    assert not np.array_equal(a, corrupt(image, name, 3, seed=0, index=1))


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_distortion_grows_with_severity(name):
    """Mean absolute pixel change from the clean image increases strictly from severity 1 to 5."""
    distortion = [
        np.mean([np.abs(corrupt(x, name, s, seed=0, index=i).astype(float) - x).mean() for i, x in enumerate(IMAGES)])
        for s in SEVERITIES
    ]
    assert all(b > a for a, b in zip(distortion, distortion[1:])), np.round(distortion, 2)


def test_large_images_scale_the_spatial_parameters():
    out = corrupt(_image(0, size=96), "motion_blur", 5)
    assert out.shape == (96, 96, 3)


def test_corrupter_wraps_pil_images_and_validates_names():
    image = Image.fromarray(_image(0))
    out = Corrupter("pixelate", 4, seed=3)(image, 0)
    assert isinstance(out, Image.Image) and out.size == image.size
    with pytest.raises(ValueError, match="unknown corruption"):
        Corrupter("rain", 1)
    with pytest.raises(ValueError, match="severity"):
        Corrupter("fog", 6)
