"""``check_data``: every user error in the data is one InputError of one line (file and line, or config key;
the bad value; what is expected), found before the backbone exists; valid data reads as before, once."""

import gzip
import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

import sve.data.checks as checks
from sve.data import (
    ARCEasyData,
    CIFAR10Data,
    CIFAR100CData,
    CIFAR100Data,
    DTDData,
    FashionMNISTData,
    Flowers102Data,
    OxfordPetsData,
    SST2Data,
    SyntheticImageData,
    SyntheticTextData,
)
from sve.data.base import take_subset
from sve.data.corruptions import CORRUPTIONS
from sve.data.image_sets import CIFAR10_CLASSES, DTD_CLASSES
from sve.data.vision import Transformed
from sve.errors import InputError
from sve.runs.run import instantiate
from tests.conftest import compose_cfg

BACKBONE = SimpleNamespace(modality="image", image_size=16, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


def refused(data, match: str, call: str = "check_data") -> str:
    """The one-line InputError that ``data.<call>()`` raises, matching ``match``."""
    with pytest.raises(InputError, match=match) as info:
        getattr(data, call)()
    message = str(info.value)
    assert "\n" not in message and "dataset.dataset" not in message and info.type is InputError
    return message


# --- SST-2 -------------------------------------------------------------------------------------------------
def sst2(root, train_rows=None, dev_rows=("a fine film\t1", "dull\t0")):
    root.mkdir(parents=True, exist_ok=True)
    rows = train_rows if train_rows is not None else [f"sentence {i}\t{i % 2}" for i in range(20)]
    (root / "train.tsv").write_text("\n".join(["sentence\tlabel", *rows]) + "\n")
    (root / "dev.tsv").write_text("\n".join(["sentence\tlabel", *dev_rows]) + "\n")
    return root


def test_sst2_missing_root_and_files(tmp_path):
    refused(
        SST2Data(root=str(tmp_path / "absent")),
        r"^dataset sst2: dataset.root=.*absent is not a directory.*"
        r"train.tsv",
    )
    sst2(tmp_path / "sst2")
    (tmp_path / "sst2" / "dev.tsv").unlink()
    refused(
        SST2Data(root=str(tmp_path / "sst2")),
        r"dataset.root=.*sst2 lacks \['dev.tsv'\]; expected .*"
        r"sentence<TAB>label",
    )


def test_sst2_non_utf8_byte_names_file_and_line(tmp_path):
    root = sst2(tmp_path)
    (root / "train.tsv").write_bytes(b"sentence\tlabel\nfine\t1\ncaf\xe9 au lait\t0\n")
    refused(SST2Data(root=str(root), val_holdout=1), r"train.tsv, line 3: byte 0xe9 is not valid UTF-8")


@pytest.mark.parametrize(("label", "shown"), [("2", "'2'"), ("-1", "'-1'"), ("1.0", "'1.0'"), ("pos", "'pos'")])
def test_sst2_bad_label_names_file_and_line(label, shown, tmp_path):
    root = sst2(tmp_path, ["good\t1", "bad\t0", f"odd\t{label}"])
    refused(
        SST2Data(root=str(root), val_holdout=1),
        rf"train.tsv, line 4: label {shown} is not valid; expected an "
        r"integer in 0..1",
    )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"dev.tsv is empty"),
        ("a fine film\t1\n", r"dev.tsv, line 1: expected a header with 'sentence' and 'label'"),
        ("sentence\tlabel\n", r"dev.tsv: no rows after the header"),
        ("sentence\tlabel\nsplit\tby a tab\t1\n", r"dev.tsv, line 2: 3 tab-separated fields where the header has 2"),
    ],
)
def test_sst2_malformed_file(text, match, tmp_path):
    root = sst2(tmp_path)
    (root / "dev.tsv").write_text(text)
    refused(SST2Data(root=str(root), val_holdout=1), match)


@pytest.mark.parametrize(("key", "value", "available"), [("train", 16, 15), ("val", 6, 5), ("test", 3, 2)])
def test_sst2_subset_larger_than_the_data_is_refused(key, value, available, tmp_path):
    data = SST2Data(root=str(sst2(tmp_path)), val_holdout=5, **{f"{key}_size": value})
    refused(
        data,
        rf"dataset.{key}_size={value} is more than the {available} examples of the {key} split of "
        rf"dataset sst2 \(.*\); give at most {available}",
    )
    refused(SST2Data(root=str(tmp_path), val_holdout=5, **{f"{key}_size": value}), f"{key}_size", call="setup")


def test_a_subset_as_large_as_the_split_is_the_whole_split(tmp_path):
    sst2(tmp_path)
    whole = SST2Data(root=str(tmp_path), val_holdout=5)
    same = SST2Data(root=str(tmp_path), val_holdout=5, train_size=15)
    whole.setup(), same.setup()
    assert same.splits["train"] == whole.splits["train"] and isinstance(same.splits["train"], list)  # no Subset
    examples = list(range(7))
    assert take_subset(examples, 7, 0, "train") is examples and take_subset(examples, None, 0, "train") is examples
    assert len(take_subset(examples, 6, 0, "train")) == 6
    with pytest.raises(InputError, match=r"^dataset.train_size=8 is more than the 7 examples of the train split"):
        take_subset(examples, 8, 0, "train")


def test_sst2_hub_without_network_fails_at_once_in_one_line(monkeypatch):
    import datasets

    seen, before = [], datasets.config.HF_HUB_OFFLINE

    def offline(*args, **kwargs):
        seen.append(datasets.config.HF_HUB_OFFLINE)  # the local cache only: no half minute of retries
        raise ConnectionError("Couldn't reach 'glue' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(checks, "hub_reachable", lambda timeout=5.0: False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    refused(
        SST2Data(root=None),
        r"dataset sst2: the Hugging Face hub cannot be reached and the local cache lacks "
        r"glue/sst2 \(ConnectionError: .*\); set dataset.root to a directory with train.tsv",
    )
    assert seen == [True] and datasets.config.HF_HUB_OFFLINE is before


def test_check_data_is_cached_and_setup_reads_nothing_again(tmp_path, monkeypatch):
    import sve.data.sst2 as sst2_module

    root = sst2(tmp_path)
    calls = []
    read = sst2_module.read_tsv
    monkeypatch.setattr(sst2_module, "read_tsv", lambda *a: calls.append(a[0].name) or read(*a))
    data = SST2Data(root=str(root), val_holdout=5, train_size=4)
    data.check_data()
    data.check_data()
    assert calls == ["train.tsv", "dev.tsv"]
    (root / "train.tsv").unlink()  # parsed already: setup does not read it again
    data.setup()
    assert calls == ["train.tsv", "dev.tsv"] and len(data.splits["train"]) == 4


def test_setup_checks_the_data_without_check_data(tmp_path):
    root = sst2(tmp_path, ["good\t1", "bad\t7"])
    refused(SST2Data(root=str(root), val_holdout=1), r"train.tsv, line 3: label '7'", call="setup")


# --- ARC -----------------------------------------------------------------------------------------------------
QUESTION = {
    "id": "q1",
    "question": "Which is a planet?",
    "choices": {"text": ["sun", "moon", "mars", "comet"], "label": ["A", "B", "C", "D"]},
    "answerKey": "C",
}


def arc(root, bad: str | None = None, split: str = "validation", line: int = 2):
    """Three ARC-Easy files of three questions; ``bad`` replaces line ``line`` of ``split``."""
    root.mkdir(parents=True, exist_ok=True)
    for s in ("train", "validation", "test"):
        lines = [json.dumps(dict(QUESTION, id=f"{s}{i}")) for i in range(3)]
        if s == split and bad is not None:
            lines[line - 1] = bad
        (root / f"ARC-Easy-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_arc_missing_root_and_files(tmp_path):
    refused(ARCEasyData(root=str(tmp_path / "absent")), r"dataset arc_easy: dataset.root=.*absent is not a directory")
    arc(tmp_path)
    (tmp_path / "ARC-Easy-test.jsonl").unlink()
    refused(ARCEasyData(root=str(tmp_path)), r"lacks \['ARC-Easy-test.jsonl'\]; expected ARC-Easy-\{train,validation,")


def bad_record(**changes):
    record = dict(QUESTION, id="bad", **changes)
    return json.dumps({k: v for k, v in record.items() if v is not None})


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (
            '{"id": "bad", "question": "Which?", ',
            r"line 2: not valid JSON \(.*\); expected a JSON object .* on each line",
        ),
        (
            bad_record(answerKey="E"),
            r"line 2: question bad: answerKey 'E' is not among the option labels "
            r"\['A', 'B', 'C', 'D'\]",
        ),
        (
            bad_record(choices={"text": list("abcdef"), "label": list("ABCDEF")}),
            r"line 2: question bad has 6 options; at least 2 and at most 5 are supported \(the dataset has 5 classes",
        ),
        (bad_record(choices={"text": ["x"], "label": ["A"]}, answerKey="A"), r"line 2: question bad has 1 options"),
        (bad_record(answerKey=None), r"line 2: the record lacks \['answerKey'\]"),
        (
            bad_record(choices={"text": ["a", "b", "c"], "label": ["A", "B"]}),
            r"line 2: question bad has 3 option texts "
            r"but 2 labels",
        ),
        (
            bad_record(choices={"text": ["a", "b"], "label": ["A", "A"]}, answerKey="A"),
            r"line 2: question bad: the option labels \['A', 'A'\] repeat",
        ),
        (json.dumps(["not", "an", "object"]), r"line 2: expected a JSON object with question, choices"),
        (json.dumps(dict(QUESTION, id="validation0")), r"line 2: question id 'validation0' repeats line 1"),
    ],
)
def test_arc_bad_line_names_file_and_line(line, match, tmp_path):
    refused(ARCEasyData(root=str(arc(tmp_path, line))), rf"ARC-Easy-validation.jsonl, {match}")


def test_arc_non_utf8_empty_file_and_sizes(tmp_path):
    arc(tmp_path)
    (tmp_path / "ARC-Easy-test.jsonl").write_bytes(b'{"id": "x"}\n{"question": "\xff"}\n')
    refused(ARCEasyData(root=str(tmp_path)), r"ARC-Easy-test.jsonl, line 2: byte 0xff is not valid UTF-8")
    (tmp_path / "ARC-Easy-test.jsonl").write_text("\n\n")
    refused(ARCEasyData(root=str(tmp_path)), r"ARC-Easy-test.jsonl: no questions")
    arc(tmp_path)
    refused(
        ARCEasyData(root=str(tmp_path), test_size=4),
        r"dataset.test_size=4 is more than the 3 examples of the "
        r"test split of dataset arc_easy \(.*ARC-Easy-test.jsonl\)",
    )
    ARCEasyData(root=str(tmp_path), test_size=3).check_data()


def test_arc_challenge_errors_name_arc_challenge(tmp_path):
    cfg = compose_cfg(["dataset=arc_challenge", f"dataset.root={tmp_path}", "dataset.val_size=5"])
    arc(tmp_path)
    refused(instantiate(cfg.dataset), r"dataset arc_challenge: dataset.root=.* lacks \['ARC-Challenge-train.jsonl'")


# --- image files ---------------------------------------------------------------------------------------------
def jpg(path, seed=0, size=(12, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)).save(path)


def flowers(root, n=8, labels=None, sets=None):
    base = root / "flowers-102"
    for i in range(1, n + 1):
        jpg(base / "jpg" / f"image_{i:05d}.jpg", i)
    savemat(base / "imagelabels.mat", {"labels": np.array([labels or [(i % 3) + 1 for i in range(n)]])})
    sets = sets or {"trnid": [1, 2, 3], "valid": [4, 5], "tstid": [6, 7, 8]}
    savemat(base / "setid.mat", {k: np.array([v]) if isinstance(v, list) else v for k, v in sets.items()})
    return root


def cifar10_tree(root, classes=CIFAR10_CLASSES, per_class=1):
    for split in ("train", "test"):
        for c in classes:
            for i in range(per_class):
                jpg(root / split / c / f"{i:04d}.jpg", i, (8, 8))
    return root


def fake_cifar100(root, n=10, labels=None):
    (root / "cifar-100-python").mkdir(parents=True)
    for name in ("train", "test"):
        entry = {
            "data": np.random.default_rng(0).integers(0, 255, (n, 3072), dtype=np.uint8),
            "fine_labels": labels or [i % 100 for i in range(n)],
        }
        with open(root / "cifar-100-python" / name, "wb") as f:
            pickle.dump(entry, f)
    with open(root / "cifar-100-python" / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, f)
    return root


def idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def fashion(root, n_train=12, n_test=5):
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        idx(root / f"{prefix}-images-idx3-ubyte.gz", np.random.default_rng(0).integers(0, 255, (n, 28, 28)))
        idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


@pytest.mark.parametrize(
    ("cls", "missing"),
    [
        (Flowers102Data, r"\['flowers-102/jpg/', 'flowers-102/imagelabels.mat', 'flowers-102/setid.mat'\]"),
        (DTDData, r"\['dtd/dtd/images/', 'dtd/dtd/labels/train1.txt'"),
        (OxfordPetsData, r"\['oxford-iiit-pet/images/', 'oxford-iiit-pet/annotations/trainval.txt'"),
        (CIFAR100Data, r"\['cifar-100-python/train', 'cifar-100-python/test', 'cifar-100-python/meta'\]"),
        (CIFAR10Data, r"\['cifar-10-batches-py/data_batch_1'"),
    ],
)
def test_missing_image_data_says_what_is_missing_and_how_to_provide_it(cls, missing, tmp_path):
    data = cls(root=str(tmp_path), download=False)  # constructing reads nothing
    message = refused(
        data,
        rf"dataset {cls.name}: dataset.root={tmp_path} lacks {missing}.*; set dataset.root to "
        r"a directory holding .*, or dataset.download=true to download it there",
    )
    assert cls.LAYOUT in message


def test_fashion_mnist_missing_files_offer_no_download(tmp_path):
    fashion(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    message = refused(
        FashionMNISTData(root=str(tmp_path)),
        r"dataset fashion_mnist: dataset.root=.* lacks "
        r"\['t10k-labels-idx1-ubyte\[.gz\]'\]; .*apt-get install",
    )
    assert "download=true" not in message


@pytest.mark.parametrize("cls", [DTDData, CIFAR10Data, OxfordPetsData])
def test_a_failed_download_is_one_line_in_check_data(cls, tmp_path, monkeypatch):
    from urllib.error import URLError

    def offline(*args, **kwargs):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(cls, "fetch", lambda self, root: offline())
    data = cls(root=str(tmp_path / "cache"))  # download=true by default
    refused(
        data,
        rf"dataset {cls.name}: dataset.root=.*cache lacks \[.*\] and downloading them there failed "
        r"\(URLError: .*name resolution>\); without network set dataset.root to a directory holding",
    )


def test_cifar10_tree_must_have_exactly_the_ten_class_folders(tmp_path):
    nine = cifar10_tree(tmp_path / "nine", CIFAR10_CLASSES[:-1])
    refused(
        CIFAR10Data(root=str(nine), val_holdout=1),
        r"dataset cifar10: .*nine/train has 9 class folders where the "
        r"10 CIFAR-10 classes .* missing \['truck'\], extra \[\]",
    )
    eleven = cifar10_tree(tmp_path / "eleven", CIFAR10_CLASSES + ("zebra",))
    refused(CIFAR10Data(root=str(eleven), val_holdout=1), r"has 11 class folders .* missing \[\], extra \['zebra'\]")
    renamed = cifar10_tree(tmp_path / "renamed", ("plane",) + CIFAR10_CLASSES[1:])
    refused(CIFAR10Data(root=str(renamed), val_holdout=1), r"missing \['airplane'\], extra \['plane'\]")
    half = cifar10_tree(tmp_path / "half")
    for f in (half / "test").rglob("*"):
        if f.is_file():
            f.unlink()
    for d in sorted((half / "test").iterdir()):
        d.rmdir()
    (half / "test").rmdir()
    refused(CIFAR10Data(root=str(half), val_holdout=1), r"dataset.root=.*half lacks \['test/'\]")


def test_cifar10_empty_class_folder(tmp_path):
    root = cifar10_tree(tmp_path)
    (root / "test" / "cat" / "0000.jpg").unlink()
    refused(
        CIFAR10Data(root=str(root), val_holdout=1),
        r"cannot read the image tree .*test \(FileNotFoundError: "
        r"Found no valid file for the classes cat",
    )


def test_a_corrupt_jpeg_is_found_before_the_backbone(tmp_path):
    root = cifar10_tree(tmp_path, per_class=2)
    (root / "train" / "dog" / "0001.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    truncated = (root / "test" / "cat" / "0000.jpg").read_bytes()
    (root / "test" / "cat" / "0000.jpg").write_bytes(truncated[: len(truncated) // 2])
    message = refused(
        CIFAR10Data(root=str(root), val_holdout=2),
        r"dataset cifar10: 2 of the 40 images the run reads "
        r"cannot be read: .*train/dog/0001.jpg",
    )
    assert "test/cat/0000.jpg" in message
    data = CIFAR10Data(root=str(root), val_holdout=2)
    data.attach(BACKBONE)
    refused(data, r"train/dog/0001.jpg", call="setup")


def test_only_the_images_of_the_chosen_subsets_are_decoded_once(tmp_path, monkeypatch):
    decoded = []
    monkeypatch.setattr("sve.data.vision.decode_images", lambda files, what: decoded.append(list(files)))
    cifar10_tree(tmp_path / "c10", per_class=3)
    ood = CIFAR10Data(root=str(tmp_path / "c10"), val_holdout=5, test_size=4)
    data = Flowers102Data(root=str(flowers(tmp_path / "fl")), download=False, train_size=2, test_size=1, ood=ood)
    data.check_data()
    assert [len(files) for files in decoded] == [2 + 2 + 1, 4]  # the OOD module: its test subset only
    data.attach(BACKBONE)
    data.setup()
    data.check_data()
    assert len(decoded) == 2
    assert {f.name for f in decoded[0]} >= {"image_00004.jpg", "image_00005.jpg"}  # the whole val split


def test_an_error_in_the_ood_data_is_found_by_the_main_module(tmp_path):
    ood = CIFAR10Data(root=str(tmp_path / "absent"), download=False)
    data = CIFAR100Data(root=str(fake_cifar100(tmp_path / "c100")), download=False, val_holdout=2, ood=ood)
    refused(data, r"dataset.ood cifar10: dataset.ood.root=.*absent lacks")


def test_flowers_metadata_errors_name_the_file(tmp_path):
    refused(
        Flowers102Data(root=str(flowers(tmp_path / "a", labels=[1, 2, 3, 4, 5, 6, 7, 103])), download=False),
        r"imagelabels.mat: 'labels' entry 8 is 103; expected classes 1..102",
    )
    sets = {"trnid": [1, 2, 9], "valid": [4, 5], "tstid": [6, 7, 8]}
    refused(
        Flowers102Data(root=str(flowers(tmp_path / "b", sets=sets)), download=False),
        r"setid.mat: 'trnid' entry 3 is image id 9; imagelabels.mat labels ids 1..8",
    )
    sets = {"trnid": [1, 2, 1], "valid": [4, 5], "tstid": [6, 7, 8]}
    refused(
        Flowers102Data(root=str(flowers(tmp_path / "c", sets=sets)), download=False),
        r"setid.mat: 'trnid' lists image id 1 twice \(entries 1 and 3\)",
    )
    (flowers(tmp_path / "d") / "flowers-102" / "setid.mat").write_bytes(b"garbage")
    refused(Flowers102Data(root=str(tmp_path / "d"), download=False), r"setid.mat: not a readable MATLAB .mat file")
    (flowers(tmp_path / "e") / "flowers-102" / "jpg" / "image_00007.jpg").unlink()
    refused(
        Flowers102Data(root=str(tmp_path / "e"), download=False),
        r"1 of the 8 images the run reads cannot be read: .*image_00007.jpg \(FileNotFoundError",
    )


def dtd(root, lists):
    data = root / "dtd" / "dtd"
    (data / "labels").mkdir(parents=True, exist_ok=True)
    for split, lines in lists.items():
        for line in lines:
            if "/" in line and line.split("/")[0] in DTD_CLASSES:
                jpg(data / "images" / line)
        (data / "labels" / f"{split}1.txt").write_text("\n".join(lines) + "\n")
    return root


GOOD_DTD = {"train": ["banded/a.jpg", "dotted/b.jpg"], "val": ["banded/c.jpg"], "test": ["dotted/d.jpg"]}


@pytest.mark.parametrize(
    ("test_lines", "match"),
    [
        (["dotted"], r"test1.txt, line 1: 'dotted' is not <class>/<image file>"),
        (
            ["dotted/d.jpg", "dotty/e.jpg"],
            r"test1.txt, line 2: class 'dotty' is not one of the 47 DTD classes \(banded",
        ),
        (
            ["dotted/d.jpg", "", "dotted/d.jpg"],
            r"test1.txt, line 3: image 'dotted/d.jpg' is listed again \(first on "
            r"line 1\)",
        ),
        ([], r"test1.txt lists no images"),
    ],
)
def test_dtd_label_file_errors_name_file_and_line(test_lines, match, tmp_path):
    refused(DTDData(root=str(dtd(tmp_path, dict(GOOD_DTD, test=test_lines))), download=False), match)


def test_metadata_text_must_be_utf8_and_split_lists_not_empty(tmp_path):
    root = dtd(tmp_path / "dtd", GOOD_DTD)
    (root / "dtd" / "dtd" / "labels" / "val1.txt").write_bytes(b"banded/c.jpg\nbanded/\xe7.jpg\n")
    refused(DTDData(root=str(root), download=False), r"val1.txt, line 2: byte 0xe7 is not valid UTF-8")
    sets = {"trnid": [1, 2, 3], "valid": np.zeros((1, 0)), "tstid": [6, 7, 8]}
    refused(
        Flowers102Data(root=str(flowers(tmp_path / "fl", sets=sets)), download=False),
        r"setid.mat: 'valid' must be a non-empty vector of integers",
    )


def test_dtd_labels_do_not_shift_when_a_split_lacks_classes(tmp_path):
    data = DTDData(root=str(dtd(tmp_path, GOOD_DTD)), download=False)
    data.check_data()
    dotted = DTD_CLASSES.index("dotted")
    assert [y for _, y in data.parsed["train"]] == [0, dotted] and [y for _, y in data.parsed["test"]] == [dotted]
    with pytest.raises(InputError, match=r"^dataset.partition=11 is not valid; expected an integer in 1..10"):
        DTDData(partition=11)


def pets(root, trainval, test=("Abyssinian_100 1 1 1",)):
    base = root / "oxford-iiit-pet"
    (base / "annotations").mkdir(parents=True)
    for name, lines in (("trainval", trainval), ("test", test)):
        (base / "annotations" / f"{name}.txt").write_text("\n".join(lines) + "\n")
        for line in lines:
            jpg(base / "images" / f"{line.split()[0]}.jpg")
    return root


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("beagle_1 38 2 1", r"line 3: 'beagle_1 38 2 1' is not valid; expected <image name> <class id 1..37>"),
        ("beagle_1", r"line 3: 'beagle_1' is not valid"),
        ("beagle_1 x 2 1", r"line 3: 'beagle_1 x 2 1' is not valid"),
        (
            "Abyssinian_2 5 1 1",
            r"line 3: Abyssinian_2 has class id 5, but Abyssinian images have class id 1 \(.*line 1\)",
        ),
        ("Abyssinian_0 1 1 1", r"line 3: image 'Abyssinian_0' is listed again \(first on line 1\)"),
    ],
)
def test_pets_annotation_errors_name_file_and_line(line, match, tmp_path):
    root = pets(tmp_path, ["Abyssinian_0 1 1 1", "beagle_0 2 2 1", line])
    refused(OxfordPetsData(root=str(root), download=False, val_holdout=1), rf"trainval.txt, {match}")


def test_cifar_pickle_errors_name_the_file(tmp_path):
    refused(
        CIFAR100Data(root=str(fake_cifar100(tmp_path / "a", 3, [0, 1, 100])), download=False, val_holdout=1),
        r"cifar-100-python/train: label 100 of image 2 is not valid; expected an integer in 0..99",
    )
    refused(
        CIFAR100Data(root=str(fake_cifar100(tmp_path / "b", labels=[0, 1])), download=False, val_holdout=1),
        r"cifar-100-python/train: 10 images but 'fine_labels' has shape \(2,\)",
    )
    (fake_cifar100(tmp_path / "c") / "cifar-100-python" / "test").write_bytes(b"not a pickle")
    refused(
        CIFAR100Data(root=str(tmp_path / "c"), download=False, val_holdout=1),
        r"cifar-100-python/test: not a readable pickle of the CIFAR python release \(UnpicklingError",
    )
    with open(fake_cifar100(tmp_path / "d") / "cifar-100-python" / "meta", "wb") as f:
        pickle.dump({"fine_label_names": ["only", "two"]}, f)
    refused(
        CIFAR100Data(root=str(tmp_path / "d"), download=False, val_holdout=1),
        r"cifar-100-python/meta: expected 'fine_label_names' with the 100 class names",
    )


def test_fashion_mnist_file_errors_name_the_file(tmp_path):
    root = fashion(tmp_path / "a")
    data = gzip.decompress((root / "train-images-idx3-ubyte.gz").read_bytes())
    (root / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(data[:-100]))
    refused(
        FashionMNISTData(root=str(root), val_holdout=2),
        r"train-images-idx3-ubyte.gz: the header declares shape "
        r"\(12, 28, 28\) .* truncated or corrupt",
    )
    (root / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(data)[:50])
    refused(FashionMNISTData(root=str(root), val_holdout=2), r"train-images-idx3-ubyte.gz: cannot be read \(EOFError")
    root = fashion(tmp_path / "b")
    idx(root / "t10k-labels-idx1-ubyte.gz", np.array([0, 1, 2, 3, 10]))
    refused(
        FashionMNISTData(root=str(root), val_holdout=2),
        r"t10k-labels-idx1-ubyte.gz: label 10 of image 4 is not "
        r"valid; expected 0..9",
    )
    idx(root / "t10k-labels-idx1-ubyte.gz", np.array([0, 1, 2]))
    refused(FashionMNISTData(root=str(root), val_holdout=2), r"labels of shape \(3,\) for the 5 images")


def test_image_subset_sizes_and_holdout_are_checked_against_the_data(tmp_path):
    root = str(fake_cifar100(tmp_path))
    refused(
        CIFAR100Data(root=root, download=False, val_holdout=2, train_size=9),
        r"dataset.train_size=9 is more than the 8 examples of the train split of dataset cifar100",
    )
    refused(CIFAR100Data(root=root, download=False, val_holdout=2, test_size=11), r"^dataset.test_size=11 .* 10 ")
    refused(
        CIFAR100Data(root=root, download=False, val_holdout=10),
        r"dataset.val_holdout=10 is not valid: it must be an integer between 1 and 9",
    )
    shift = dict(root=root, download=False, val_holdout=2, corruptions=["fog"], test_size=4)
    refused(
        CIFAR100Data(shift_size=5, **shift),
        r"dataset.shift_size=5 is more than the 4 examples of the test subset "
        r"each corrupted set of dataset cifar100 is made from "
        r"\(dataset.test_size=4",
    )
    CIFAR100Data(shift_size=4, **shift).check_data()
    CIFAR100Data(root=root, download=False, val_holdout=2, shift_size=50).check_data()  # no corruptions: unused
    whole = CIFAR100Data(root=root, download=False, val_holdout=2, train_size=8)
    whole.attach(BACKBONE)
    whole.setup()
    assert isinstance(whole.splits["train"], Transformed) and len(whole.splits["train"]) == 8  # not a Subset


def test_cifar100_c_release_is_checked_up_front(tmp_path):
    root = fake_cifar100(tmp_path / "c100")
    release = tmp_path / "c100c"
    release.mkdir()
    rng = np.random.default_rng(0)
    for name in ("fog", "snow"):
        np.save(release / f"{name}.npy", rng.integers(0, 255, (15, 32, 32, 3), dtype=np.uint8))
    np.save(release / "labels.npy", np.tile(np.arange(3), 5))
    kw = dict(root=str(root), download=False, val_holdout=2, corrupted_root=str(release), severities=[1])
    refused(
        CIFAR100CData(corruptions=["fog", "frost"], **kw),
        r"dataset cifar100_c: dataset.corrupted_root=.* lacks "
        r"\['frost.npy'\]",
    )
    refused(
        CIFAR100CData(corruptions=["fog"], test_size=4, **kw),
        r"dataset.test_size=4 is more than the 3 examples "
        r"of each corrupted test set",
    )
    refused(CIFAR100CData(corruptions=["fog"], shift_size=4, **kw), r"dataset.shift_size=4 is more than the 3")
    CIFAR100CData(corruptions=["fog", "snow"], test_size=3, **kw).check_data()
    (release / "snow.npy").write_bytes(b"garbage")
    refused(CIFAR100CData(corruptions=["snow"], **kw), r"snow.npy is not a readable .npy file")
    np.save(release / "labels.npy", np.tile(np.arange(3), 5) * 50)
    refused(
        CIFAR100CData(corruptions=["fog"], **kw),
        r"labels.npy: labels int64 from 0 to 100; expected integers in "
        r"0..99",
    )


def test_bad_corruption_settings_fail_at_construction():
    with pytest.raises(InputError, match=r"^dataset.test_corruption='rain' is not valid; choose one of"):
        CIFAR100Data(test_corruption="rain")
    with pytest.raises(InputError, match=r"^dataset.test_severity=6 is not valid"):
        CIFAR100Data(test_corruption="fog", test_severity=6)
    with pytest.raises(InputError, match=r"^dataset.severities has unknown entries \[6\]"):
        CIFAR100Data(corruptions=list(CORRUPTIONS[:1]), severities=[6])


# --- synthetic data ------------------------------------------------------------------------------------------
def test_synthetic_sizes():
    with pytest.raises(InputError, match=r"^dataset.num_val=0 is not valid; expected a positive integer"):
        SyntheticTextData(num_val=0)
    with pytest.raises(InputError, match=r"^dataset.train_size=0 is not valid; expected a positive integer or null"):
        SyntheticImageData(train_size=0)
    refused(
        SyntheticImageData(num_train=10, train_size=11),
        r"dataset.train_size=11 is more than the 10 examples of the train split of dataset synthetic_image "
        r"\(dataset.num_train=10\)",
    )
    refused(SyntheticTextData(num_test=5, test_size=6), r"dataset.test_size=6 .* \(dataset.num_test=5\)")
    refused(SyntheticImageData(num_test=5, test_size=5, corruptions="fog", shift_size=6), r"dataset.shift_size=6")
    data = SyntheticImageData(num_train=10, train_size=10)
    data.check_data()  # no backbone needed
    data.attach(SimpleNamespace(modality="image", image_size=8))
    data.setup()
    assert data.splits["train"].tensors[0].shape == (10, 3, 8, 8)  # the whole split, at the backbone's size
