"""Image loaders on tiny fabricated data in each dataset's real on-disk layout (no network, no real data)."""

import gzip
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import savemat

from sve.data import (
    CIFAR10Data,
    CIFAR100CData,
    CIFAR100Data,
    DTDData,
    FashionMNISTData,
    Flowers102Data,
    OxfordPetsData,
)
from sve.data.corruptions import CORRUPTIONS, Corrupter
from sve.data.image_sets import CIFAR10_CLASSES
from sve.errors import InputError

# What attach() reads from an image backbone: resolution and normalisation (ImageNet statistics).
BACKBONE = SimpleNamespace(modality="image", image_size=16, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def _jpg(path, seed=0, size=(20, 24)):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(path)


def _loaded(data):
    data.attach(BACKBONE)
    data.setup()
    return data


def _check_batch(data, num_classes):
    batch = next(iter(data.train_dataloader()))
    assert batch["pixel_values"].shape[1:] == (3, 16, 16) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].dtype == torch.long and int(batch["labels"].max()) < num_classes
    test = next(iter(data.test_dataloader()))
    assert test["pixel_values"].shape[1:] == (3, 16, 16)


def test_flowers102_official_files(tmp_path):
    base = tmp_path / "flowers-102"
    for i in range(1, 13):
        _jpg(base / "jpg" / f"image_{i:05d}.jpg", i)
    savemat(base / "imagelabels.mat", {"labels": np.array([[1, 2, 3, 102] * 3])})  # 1-based, as released
    savemat(
        base / "setid.mat",
        {"trnid": np.array([[1, 2, 3, 4]]), "valid": np.array([[5, 6]]), "tstid": np.array([[7, 8, 9, 10, 11, 12]])},
    )
    data = _loaded(Flowers102Data(root=str(tmp_path), download=False, batch_size=2))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [4, 2, 6]
    assert sorted(lbl for _, lbl in data.splits["train"]) == [0, 1, 2, 101]
    _check_batch(data, 102)


def test_dtd_partition_files(tmp_path):
    base = tmp_path / "dtd" / "dtd"
    for split, names in {
        "train": ["banded/a.jpg", "dotted/b.jpg"],
        "val": ["banded/c.jpg"],
        "test": ["dotted/d.jpg", "woven/e.jpg"],
    }.items():
        for n in names:
            _jpg(base / "images" / n)
        (base / "labels").mkdir(parents=True, exist_ok=True)
        (base / "labels" / f"{split}1.txt").write_text("\n".join(names) + "\n")
    data = _loaded(DTDData(root=str(tmp_path), download=False, batch_size=2))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [2, 1, 2]
    _check_batch(data, 47)


def test_oxford_pets_trainval_with_seeded_holdout(tmp_path):
    base = tmp_path / "oxford-iiit-pet"
    rows = {
        "trainval": [f"Abyssinian_{i} 1 1 1" for i in range(6)] + [f"beagle_{i} 2 2 1" for i in range(4)],
        "test": ["Abyssinian_100 1 1 1", "beagle_100 2 2 1"],
    }
    (base / "annotations").mkdir(parents=True)
    for split, lines in rows.items():
        (base / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
        for line in lines:
            _jpg(base / "images" / f"{line.split()[0]}.jpg")
    data = _loaded(OxfordPetsData(root=str(tmp_path), download=False, val_holdout=3, batch_size=2))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [7, 3, 2]
    again = _loaded(OxfordPetsData(root=str(tmp_path), download=False, val_holdout=3))
    assert data.splits["val"].dataset.indices == again.splits["val"].dataset.indices  # seeded
    _check_batch(data, 37)


def _cifar_pickles(root, folder, files, key, n, num_classes, meta):
    (root / folder).mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in files:
        entry = {"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), key: [i % num_classes for i in range(n)]}
        with open(root / folder / name, "wb") as f:
            pickle.dump(entry, f)
    with open(root / folder / meta[0], "wb") as f:
        pickle.dump({meta[1]: [f"class{i}" for i in range(num_classes)]}, f)


def _fake_cifar100(root, n=10):
    _cifar_pickles(root, "cifar-100-python", ["train", "test"], "fine_labels", n, 100, ("meta", "fine_label_names"))


def test_cifar100_pickle_release(tmp_path):
    _fake_cifar100(tmp_path)
    data = _loaded(CIFAR100Data(root=str(tmp_path), download=False, val_holdout=2, batch_size=4))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [8, 2, 10]
    _check_batch(data, 100)


def test_cifar10_from_imagefolder_and_from_pickles(tmp_path):
    tree = tmp_path / "jpg"
    for split in ("train", "test"):
        for name in CIFAR10_CLASSES:  # every class folder, as check_data requires
            _jpg(tree / split / name / "0000.jpg", size=(32, 32))
    data = _loaded(CIFAR10Data(root=str(tree), val_holdout=2, batch_size=3))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [8, 2, 10]
    assert sorted({lbl for _, lbl in data.splits["test"]}) == list(range(10))  # alphabetical = official order
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    _cifar_pickles(tmp_path / "pkl", "cifar-10-batches-py", files, "labels", 4, 10, ("batches.meta", "label_names"))
    data = _loaded(CIFAR10Data(root=str(tmp_path / "pkl"), download=False, val_holdout=4))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [16, 4, 4]


def _idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 12), ("t10k", 5)):
        _idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)))
        _idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    data = _loaded(FashionMNISTData(root=str(tmp_path), val_holdout=2, batch_size=4))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [10, 2, 5]
    _check_batch(data, 10)  # grayscale made 3-channel


@pytest.mark.parametrize(
    "cls, layout",
    [
        (Flowers102Data, "setid.mat"),
        (DTDData, "labels"),
        (OxfordPetsData, "annotations"),
        (CIFAR100Data, "cifar-100-python"),
        (CIFAR10Data, "train/<class>"),
        (FashionMNISTData, "idx3"),
    ],
)
def test_missing_data_error_names_dataset_key_and_layout(cls, layout, tmp_path):
    data = cls(root=str(tmp_path), download=False)
    data.attach(BACKBONE)
    with pytest.raises(InputError, match=rf"dataset {cls.name}.*dataset\.root.*{layout}"):
        data.setup()


def test_test_corruption_applies_only_to_the_test_split(tmp_path):
    _fake_cifar100(tmp_path)
    clean = _loaded(CIFAR100Data(root=str(tmp_path), download=False, val_holdout=2))
    noisy = _loaded(
        CIFAR100Data(
            root=str(tmp_path), download=False, val_holdout=2, test_corruption="impulse_noise", test_severity=5
        )
    )
    assert not torch.equal(clean.splits["test"][0][0], noisy.splits["test"][0][0])
    torch.testing.assert_close(clean.splits["val"][0][0], noisy.splits["val"][0][0])


def _fake_cifar100_c(root, n=3):
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in CORRUPTIONS:
        np.save(root / f"{name}.npy", rng.integers(0, 255, (5 * n, 32, 32, 3), dtype=np.uint8))
    np.save(root / "labels.npy", np.tile(np.arange(n) * 7, 5).astype(np.int64))


def test_cifar100_c_release_gives_one_set_per_corruption_and_severity(tmp_path):
    _fake_cifar100(tmp_path / "c100")
    _fake_cifar100_c(tmp_path / "c100c")
    kw = dict(root=str(tmp_path / "c100"), download=False, val_holdout=2, corrupted_root=str(tmp_path / "c100c"))
    data = _loaded(CIFAR100CData(corruptions=["fog", "snow"], severities=[2, 5], **kw))
    assert data.evaluation_sets() == ["val", "test", "shift/fog/2", "shift/fog/5", "shift/snow/2", "shift/snow/5"]
    assert len(data.splits["test"]) == 10  # the clean CIFAR-100 test split (severity 0), not a pooled set
    fog2 = data.shifted_test("fog", 2)
    assert len(fog2) == 3 and [lbl for _, lbl in fog2] == [0, 7, 14]
    # Severity s is rows (s-1)*n .. s*n of the file.
    raw = np.load(tmp_path / "c100c" / "fog.npy")[3]
    torch.testing.assert_close(fog2[0][0], data.test_transform(Image.fromarray(raw)))
    loader = data.evaluation_loader("shift/snow/5")
    assert next(iter(loader))["pixel_values"].shape[1:] == (3, 16, 16) and len(loader.dataset) == 3
    every = _loaded(CIFAR100CData(corruptions="all", severities="all", **kw))
    assert len(every.evaluation_sets()) == 2 + 19 * 5


def test_cifar100_c_generated_when_no_release(tmp_path):
    _fake_cifar100(tmp_path)
    data = _loaded(
        CIFAR100CData(root=str(tmp_path), download=False, val_holdout=2, corruptions=["contrast"], severities=[1, 5])
    )
    assert data.evaluation_sets()[2:] == ["shift/contrast/1", "shift/contrast/5"]
    clean, shifted = data.splits["test"], data.shifted_test("contrast", 5)
    assert len(shifted) == len(clean) == 10
    assert [y for _, y in shifted] == [y for _, y in clean]
    assert not torch.equal(shifted[0][0], clean[0][0])


def test_every_image_dataset_can_be_evaluated_under_shift(tmp_path):
    """Shift sets come from the image base class: CIFAR-10, Fashion-MNIST, ... get them with dataset.corruptions;
    each is the test split (the same test_size subset) through the corruption generator."""
    _fake_cifar100(tmp_path)
    plain = _loaded(CIFAR100Data(root=str(tmp_path), download=False, val_holdout=2))
    assert plain.evaluation_sets() == ["val", "test"]
    data = _loaded(
        CIFAR100Data(
            root=str(tmp_path),
            download=False,
            val_holdout=2,
            test_size=4,
            corruptions="gaussian_noise",
            severities=3,
            corruption_seed=5,
        )
    )
    assert data.evaluation_sets() == ["val", "test", "shift/gaussian_noise/3"]
    shifted = data.evaluation_loader("shift/gaussian_noise/3").dataset.dataset  # Keyed(Subset(...))
    assert shifted.indices == data.splits["test"].indices  # the same 4 test images
    raw, label = data.raw_test[shifted.indices[0]]
    expected = data.test_transform(Corrupter("gaussian_noise", 3, seed=5)(raw.convert("RGB"), shifted.indices[0]))
    torch.testing.assert_close(shifted[0][0], expected)
    assert shifted[0][1] == label


def test_cifar100_c_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="dataset.corruptions.*frosty"):
        CIFAR100CData(corruptions=["frosty"])
    _fake_cifar100(tmp_path)
    data = CIFAR100CData(root=str(tmp_path), download=False, val_holdout=2, corrupted_root=str(tmp_path / "none"))
    data.attach(BACKBONE)
    with pytest.raises(InputError, match="dataset.corrupted_root.*labels.npy"):
        data.setup()


def test_cifar10_as_the_ood_set_of_cifar100(tmp_path):
    _fake_cifar100(tmp_path / "c100")
    for c in CIFAR10_CLASSES:
        for split in ("train", "test"):
            _jpg(tmp_path / "c10" / split / c / "0000.jpg", size=(32, 32))
    ood = CIFAR10Data(root=str(tmp_path / "c10"), val_holdout=1, batch_size=2)
    data = CIFAR100Data(root=str(tmp_path / "c100"), download=False, val_holdout=2, batch_size=4, ood=ood)
    data.attach(BACKBONE)  # attaches the OOD module too: same transforms
    loaders = data.test_dataloader()
    assert len(loaders) == 2 and next(iter(loaders[1]))["pixel_values"].shape == (2, 3, 16, 16)


def test_low_resolution_datasets_resize_the_whole_image_for_test(tmp_path):
    """CIFAR is resized to the backbone's resolution whole (no center crop cutting the borders)."""
    _fake_cifar100(tmp_path)
    data = _loaded(CIFAR100Data(root=str(tmp_path), download=False, val_holdout=2))
    raw = data.splits["test"].dataset[0][0].convert("RGB")
    expected = torch.tensor(np.asarray(raw.resize((16, 16), Image.BILINEAR)), dtype=torch.float32) / 255
    mean, std = torch.tensor(BACKBONE.mean), torch.tensor(BACKBONE.std)
    torch.testing.assert_close(data.splits["test"][0][0], ((expected - mean) / std).permute(2, 0, 1), atol=0.03, rtol=0)


def test_fashion_mnist_from_the_debian_package():
    root = Path("/usr/share/datasets/fashion-mnist")
    if not (root / "t10k-labels-idx1-ubyte.gz").exists():
        pytest.skip(f"needs {root} (apt-get install dataset-fashion-mnist)")
    raw = FashionMNISTData().load_raw()
    assert (len(raw["train"]), len(raw["test"])) == (60_000, 10_000)
    assert raw["test"].images.shape[1:] == (28, 28) and set(raw["test"].labels.tolist()) == set(range(10))


def test_cifar100_c_config_selects_by_name():
    from sve.runs.run import instantiate
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["dataset=cifar100_c", "dataset.corruptions=[fog,snow]", "dataset.severities=3"])
    data = instantiate(cfg.dataset)
    assert data.corruptions == ["fog", "snow"] and data.severities == [3]


def test_failed_download_names_dataset_key_and_layout(monkeypatch, tmp_path):
    """What a user without network sees: torchvision's download error, re-raised with the fix."""
    from urllib.error import URLError

    import sve.data.image_sets as image_sets

    def offline(*args, **kwargs):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(image_sets, "_Flowers102", offline)
    data = Flowers102Data(root=None)
    data.attach(BACKBONE)
    with pytest.raises(InputError, match=r"dataset flowers102.*name resolution.*dataset\.root.*flowers-102/"):
        data.setup()


def test_shift_size_evaluates_each_corrupted_set_on_the_same_part_of_the_test_examples(tmp_path):
    _fake_cifar100(tmp_path)
    kw = dict(
        root=str(tmp_path),
        download=False,
        val_holdout=2,
        test_size=6,
        corruptions=["gaussian_noise", "contrast"],
        severities=[1, 5],
    )
    data = _loaded(CIFAR100Data(shift_size=3, **kw))
    test_images = set(data.splits["test"].indices)

    def examples(name):  # the raw test indices a shift set evaluates
        subset = data.evaluation_loader(name).dataset.dataset  # Keyed(Subset(Subset(shifted)))
        return [subset.dataset.indices[i] for i in subset.indices]

    chosen = examples("shift/gaussian_noise/1")
    assert len(chosen) == 3 and set(chosen) <= test_images
    assert all(examples(s) == chosen for s in ("shift/gaussian_noise/5", "shift/contrast/1", "shift/contrast/5"))
    assert len(data.evaluation_loader("test").dataset) == 6  # the clean test set keeps all of its examples
    everything = _loaded(CIFAR100Data(shift_size=None, **kw))
    assert len(everything.evaluation_loader("shift/contrast/5").dataset) == 6
    for bad in (0, -2, 2.5, True):
        with pytest.raises(InputError, match=rf"dataset.shift_size={bad!r} is not valid"):
            CIFAR100Data(shift_size=bad, **kw)
