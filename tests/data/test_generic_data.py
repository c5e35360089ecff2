"""``dataset=image_folder`` and ``dataset=text_table``: a user's own images and texts with no code. Facts checked:
the classes come from the training split and keep their numbers in every split (a test folder lacking a class
shifts nothing), labels of any type are numbered in sorted order, held-out validation is seeded, every bad input
is one error naming the file and what is valid, and a run trains on both end to end."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sve.data import ImageFolderData, TextTableData
from sve.data.image_folder import ClassFolder
from sve.errors import InputError
from sve.runs.run import run
from tests.conftest import compose_cfg


def image_tree(root, splits: dict[str, dict[str, int]]):
    """root/<split>/<class>/<i>.png, each image one flat colour that encodes its class and split."""
    rng = np.random.default_rng(0)
    for split, classes in splits.items():
        for name, count in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def labels_of(dataset) -> list[int]:
    return [dataset[i][1] for i in range(len(dataset))]


def test_an_image_folder_numbers_every_split_by_the_training_classes(tmp_path):
    root = image_tree(tmp_path, {"train": {"cat": 4, "dog": 4, "eel": 4}, "test": {"cat": 2, "eel": 3}})
    (root / "train" / ".ipynb_checkpoints").mkdir()  # hidden folders are no classes
    data = ImageFolderData(root=str(root))
    assert data.num_classes == 3 and data.classes == ["cat", "dog", "eel"]
    test = data.parsed["test"]
    # ImageFolder alone would number test's two folders 0 and 1, so an eel would be labelled a dog
    assert sorted(labels_of(test)) == [0, 0, 2, 2, 2]
    assert len(data.parsed["val"]) == 1 and len(data.parsed["train"]) == 11  # a tenth of 12 held out


def test_class_folders_named_by_integers_are_numbered_in_numeric_order(tmp_path):
    root = image_tree(tmp_path, {"train": {"10": 2, "2": 2, "1": 2}, "test": {"2": 1, "10": 1}})
    data = ImageFolderData(root=str(root), val_holdout=1)
    data.check_data()
    assert data.class_names() == ["1", "2", "10"] and sorted(labels_of(data.parsed["test"])) == [1, 2]


def test_an_image_folder_uses_its_own_validation_split(tmp_path):
    root = image_tree(tmp_path, {"train": {"a": 2, "b": 2}, "val": {"b": 1}, "test": {"a": 1, "b": 1}})
    data = ImageFolderData(root=str(root))
    data.check_data()
    assert labels_of(data.parsed["val"]) == [1] and len(data.parsed["train"]) == 4


def test_an_image_folder_reads_gifs_skips_hidden_files_and_names_the_files_it_does_not_read(tmp_path, caplog):
    root = image_tree(tmp_path, {"train": {"a": 2, "b": 2}, "test": {"a": 1, "b": 1}})
    frame = np.zeros((8, 8), dtype=np.uint8)
    Image.fromarray(frame).convert("P").save(root / "train" / "a" / "palette.GIF")  # PIL reads it, ImageFolder did not
    (root / "train" / "b" / "._0.png").write_bytes(b"\x00\x05\x16\x07")  # a macOS AppleDouble file: no image
    (root / "train" / "b" / "notes.txt").write_text("taken on a phone")
    (root / "train" / "b" / "raw.CR2").write_bytes(b"raw")
    data = ImageFolderData(root=str(root), val_holdout=1)
    with caplog.at_level("WARNING"):
        data.check_data()  # decodes every image the run reads: the AppleDouble file would fail it
    assert data.num_classes == 2 and len(data.parsed["train"]) + len(data.parsed["val"]) == 5
    read = {Path(path).name for path, _ in ClassFolder(root / "train", data.classes, allow_empty=False).samples}
    assert "palette.GIF" in read and "._0.png" not in read
    assert re.search(r"2 file\(s\) in .*train are not read as images \(1 \.cr2, 1 \.txt\)", caplog.text)


def test_deep_grey_and_rotated_images_are_read_as_they_look(tmp_path):
    # 16-bit PNGs (scans, microscopy): PIL's convert("RGB") clips every value above 255, so 99.6% of a 0-65535
    # ramp would come out white.
    root = image_tree(tmp_path, {"train": {"a": 2, "b": 2}, "test": {"a": 1}})
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    Image.fromarray(ramp).save(root / "train" / "a" / "deep.png")
    assert Image.open(root / "train" / "a" / "deep.png").mode == "I;16"
    split = ClassFolder(root / "train", ["a", "b"], allow_empty=False)
    image, _ = split[[Path(p).name for p, _ in split.samples].index("deep.png")]
    pixels = np.asarray(image)
    assert image.mode == "RGB" and pixels.min() == 0 and pixels.max() == 255
    np.testing.assert_allclose(pixels[..., 0], ramp / 257, atol=0.51)  # 65535 -> 255, linearly
    grey = np.asarray(split[0][0])  # 8-bit images are read as before
    assert grey.dtype == np.uint8 and grey.shape == (8, 8, 3)
    # A phone photo stored landscape with "rotate 90" in its EXIF is read upright, as a viewer shows it.
    photo = Image.new("RGB", (12, 6), (200, 10, 10))
    exif = photo.getexif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    photo.save(root / "train" / "b" / "photo.jpg", exif=exif)
    split = ClassFolder(root / "train", ["a", "b"], allow_empty=False)
    upright, _ = split[[Path(p).name for p, _ in split.samples].index("photo.jpg")]
    assert upright.size == (6, 12)


@pytest.mark.parametrize(
    "splits, message",
    [
        (
            {"train": {"a": 2, "b": 2}, "test": {"a": 1, "fox": 1}},
            r"test has class folders that .*train lacks: \['fox'\]; every class must have training images",
        ),
        ({"train": {"a": 3}, "test": {"a": 1}}, r"has 1 class folder\(s\) \['a'\]; a classification needs at least 2"),
        ({"train": {"a": 2, "b": 0}, "test": {"a": 1}}, r"cannot read the image tree .*train \(.*b"),
        ({"train": {"a": 2, "b": 2}}, r"lacks \['test/'\]; set dataset.root to a directory holding train/<class>"),
    ],
)
def test_a_bad_image_folder_is_one_error_naming_what_is_wrong(tmp_path, splits, message):
    root = image_tree(tmp_path, splits)
    if splits["train"].get("b") == 0:
        (root / "train" / "b").mkdir(exist_ok=True)
    with pytest.raises(InputError, match=message):
        ImageFolderData(root=str(root)).check_data()


def write_csv(path, rows: list[tuple], header=("text", "label")):
    path.write_text("\n".join([",".join(header), *(",".join(map(str, r)) for r in rows)]) + "\n")


def test_a_text_table_numbers_labels_in_sorted_order_and_holds_out_validation(tmp_path):
    write_csv(tmp_path / "train.csv", [(f"t{i}", label) for i, label in enumerate([2, 10, 2, 10, 7] * 4)])
    write_csv(tmp_path / "test.csv", [("x", 7), ("y", 10)])
    data = TextTableData(root=str(tmp_path), val_holdout=5)
    assert data.num_classes == 3 and data.label_names == [2, 7, 10]  # integers: 2 before 10, unlike strings
    assert data.parsed["test"] == [("x", 1), ("y", 2)]
    assert len(data.parsed["val"]) == 5 and len(data.parsed["train"]) == 15
    again = TextTableData(root=str(tmp_path), val_holdout=5)
    again.check_data()
    assert list(again.parsed["val"]) == list(data.parsed["val"])  # seeded by subset_seed
    assert sorted(list(data.parsed["val"]) + list(data.parsed["train"])) == sorted(
        data.examples(
            [{"text": f"t{i}", "label": v} for i, v in enumerate([2, 10, 2, 10, 7] * 4)], "", {2: 0, 7: 1, 10: 2}
        )
    )


def test_a_text_table_reads_tsv_jsonl_and_sentence_pairs(tmp_path):
    (tmp_path / "train.tsv").write_text('sentence\tlabel\nsaid "no\tneg\nyes\tpos\n')  # a lone quote, as in SST-2
    (tmp_path / "test.tsv").write_text("sentence\tlabel\nfine\tpos\n")
    data = TextTableData(root=str(tmp_path), text_column="sentence", val_holdout=1)
    data.check_data()
    assert sorted([*data.parsed["train"], *data.parsed["val"]]) == [('said "no', 0), ("yes", 1)]
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for split, rows in (
        ("train", [("a", "b", "yes"), ("c", "d", "no")]),
        ("validation", [("e", "f", "no")]),
        ("test", [("g", "h", "yes")]),
    ):
        (pairs / f"{split}.jsonl").write_text("".join(json.dumps({"p": p, "h": h, "y": y}) + "\n" for p, h, y in rows))
    data = TextTableData(root=str(pairs), text_column=["p", "h"], label_column="y")
    data.check_data()
    assert data.parsed["val"] == [(("e", "f"), 0)] and data.parsed["test"] == [(("g", "h"), 1)]


@pytest.mark.parametrize(
    "files, options, message",
    [
        (
            {"train.csv": "text,label\na,x\nb,y\n", "test.csv": "text,label\nc,z\n"},
            {},
            r"test.csv, row 1: label 'z' is not one of the training split's labels \['x', 'y'\]",
        ),
        (
            {"train.csv": "body,label\na,x\nb,y\n", "test.csv": "body,label\nc,x\n"},
            {},
            r"train.csv: no column \['text'\]; its columns are \['body', 'label'\] \(set dataset.text_column",
        ),
        (
            {"train.csv": "text,label\na,x\n", "train.jsonl": "", "test.csv": "text,label\nc,x\n"},
            {},
            r"holds 2 files for the train split \(\['train.csv', 'train.jsonl'\]\); keep one",
        ),
        (
            {"train.csv": "text,label\na,x\nb,x\n", "test.csv": "text,label\nc,x\n"},
            {},
            r"has 1 distinct label\(s\) in column 'label'; a classification needs at least 2",
        ),
        ({"train.csv": "text,label\na,x\n"}, {}, r"lacks a test file; expected train.<ext> and test.<ext>"),
        ({}, {"text_column": ["a", "b", "c"]}, r"dataset.text_column=\['a', 'b', 'c'\] is not valid"),
        # An empty label is a row someone forgot to label, not a third class named ''.
        (
            {"train.csv": "text,label\na,x\nb,y\nc,\n", "test.csv": "text,label\nc,x\n"},
            {},
            r"train.csv, row 3: the label \(column 'label'\) is empty; label the row or remove it",
        ),
        (
            {
                "train.jsonl": '{"text": "a", "label": 0}\n{"text": "b", "label": 1}\n{"text": "c", "label": null}\n',
                "test.csv": "text,label\nc,1\n",
            },
            {},
            r"train.jsonl, row 3: the label \(column 'label'\) is empty",
        ),
        (
            {"train.csv": "text,label\ncaf\u00e9,x\nb,y\n", "test.csv": "text,label\nc,x\n"},
            {"encoding": "ascii"},
            r"train.csv: is not ascii text \(UnicodeDecodeError.*\); name its encoding with dataset.encoding=",
        ),
        (
            {"train.csv": "text,label\na,x\nb,y\n", "test.csv": "text,label\nc,x\n"},
            {"encoding": "klingon"},
            r"dataset.encoding='klingon' is not an encoding Python knows",
        ),
    ],
)
def test_a_bad_text_table_is_one_error_naming_what_is_wrong(tmp_path, files, options, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=message):
        TextTableData(root=str(tmp_path), val_holdout=1, **options).check_data()


def test_a_semicolon_csv_is_read_by_its_columns(tmp_path):
    # Excel in European locales: "CSV" with ';' between columns and ',' inside texts.
    (tmp_path / "train.csv").write_text("text;label\nwell, fine, good;pos\nbad, really;neg\n", encoding="utf-8-sig")
    (tmp_path / "test.csv").write_text("text;label\nok, then;pos\n")
    data = TextTableData(root=str(tmp_path), val_holdout=1)
    data.check_data()
    assert data.label_names == ["neg", "pos"] and data.parsed["test"] == [("ok, then", 1)]
    texts = sorted(text for text, _ in [*data.parsed["train"], *data.parsed["val"]])
    assert texts == ["bad, really", "well, fine, good"]


def test_a_text_table_reads_excel_utf8_csv_and_other_encodings(tmp_path):
    # Excel's "CSV UTF-8" starts with a byte-order mark, which would otherwise become part of the first column's name.
    (tmp_path / "train.csv").write_text("text,label\nna\u00efve caf\u00e9,x\nb,y\n", encoding="utf-8-sig")
    (tmp_path / "test.csv").write_text("text,label\nd\u00e9j\u00e0 vu,y\n", encoding="latin-1")
    with pytest.raises(InputError, match="test.csv: is not utf-8 text"):
        TextTableData(root=str(tmp_path), val_holdout=1).check_data()
    (tmp_path / "test.csv").write_text("text,label\nd\u00e9j\u00e0 vu,y\n", encoding="utf-8")
    data = TextTableData(root=str(tmp_path), val_holdout=1)
    data.check_data()
    assert data.label_names == ["x", "y"] and data.parsed["test"] == [("d\u00e9j\u00e0 vu", 1)]
    assert sorted(text for text, _ in data.parsed["train"] + data.parsed["val"]) == ["b", "na\u00efve caf\u00e9"]
    for name in ("train.csv", "test.csv"):  # the same table in latin-1, named
        (tmp_path / name).write_bytes((tmp_path / name).read_text(encoding="utf-8-sig").encode("latin-1"))
    latin = TextTableData(root=str(tmp_path), val_holdout=1, encoding="latin-1")
    latin.check_data()
    assert latin.parsed["test"] == data.parsed["test"] and list(latin.parsed["train"]) == list(data.parsed["train"])


def test_empty_texts_train_as_empty_strings_with_a_warning_naming_the_rows(tmp_path, caplog):
    write_csv(tmp_path / "train.csv", [("a", "x"), ("", "y"), ("c", "x"), (" ", "y")])
    write_csv(tmp_path / "test.csv", [("d", "x")])
    data = TextTableData(root=str(tmp_path), val_holdout=1)
    data.check_data()
    assert "2 row(s) with an empty text (column ['text']), rows [2, 4]" in caplog.text
    assert sorted(t for t, _ in [*data.parsed["train"], *data.parsed["val"]]) == ["", "", "a", "c"]
    (tmp_path / "train.csv").unlink()  # JSON null and NaN are empty texts too, never the strings "None", "nan"
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"text": t, "label": y}) + "\n"
            for t, y in [("a", "x"), (None, "y"), ("c", "x"), (float("nan"), "y")]
        )
    )
    data = TextTableData(root=str(tmp_path), val_holdout=1)
    data.check_data()
    assert sorted(t for t, _ in [*data.parsed["train"], *data.parsed["val"]]) == ["", "", "a", "c"]


def test_a_text_table_needs_a_root_or_a_hub_dataset():
    with pytest.raises(InputError, match=r"text_table needs its data: set dataset.root=.* or dataset.hub_name="):
        TextTableData()


def test_both_train_end_to_end_with_the_classes_they_found(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    write_csv(
        texts / "train.csv",
        [(f"good {i}", "pos") for i in range(6)]
        + [(f"bad {i}", "neg") for i in range(6)]
        + [(f"meh {i}", "neutral") for i in range(6)],
    )
    write_csv(texts / "test.csv", [("good x", "pos"), ("bad x", "neg")])
    tiny = ["method=sve", "ensemble_size=2", "trainer.max_epochs=1", "dataset.batch_size=4"]
    text_run = ["dataset=text_table", f"dataset.root={texts}", "backbone=tiny_bert", *tiny]
    done = run(compose_cfg(text_run, tmp_path / "t"))
    assert done["num_classes"] == 3 and done["class_names"] == ["neg", "neutral", "pos"]
    assert done["metrics"]["test/examples"] == 2
    images = image_tree(tmp_path / "images", {"train": {"a": 6, "b": 6}, "test": {"b": 3}})
    image_run = ["dataset=image_folder", f"dataset.root={images}", "backbone=tiny_vit", *tiny]
    done = run(compose_cfg(image_run, tmp_path / "i"))
    assert done["num_classes"] == 2 and done["class_names"] == ["a", "b"] and done["metrics"]["test/examples"] == 3
    assert json.loads((tmp_path / "i" / "adapter" / "adapter_config.json").read_text())["class_names"] == ["a", "b"]


def test_a_hub_dataset_is_read_by_its_splits_and_columns(monkeypatch):
    # The hub is out of reach here: the loader returns a real DatasetDict made in memory, as load_dataset would.
    import datasets

    hub = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"review": ["good", "bad", "fine", "awful"], "stars": [5, 1, 4, 1], "id": [0, 1, 2, 3]}
            ),
            "validation": datasets.Dataset.from_dict({"review": ["ok"], "stars": [4], "id": [4]}),
            "test": datasets.Dataset.from_dict({"review": ["meh"], "stars": [1], "id": [5]}),
        }
    )
    asked = []
    monkeypatch.setattr(
        "sve.data.text_table.load_hub_dataset", lambda name, config, *_: asked.append((name, config)) or hub
    )
    data = TextTableData(hub_name="someone/reviews", text_column="review", label_column="stars")
    assert data.num_classes == 3 and data.label_names == [1, 4, 5] and asked == [("someone/reviews", None)]
    assert data.parsed["val"] == [("ok", 1)] and data.parsed["test"] == [("meh", 0)]
    assert data.class_names() == [1, 4, 5]  # plain integers: no names to give
    labelled = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {"text": ["a", "b"], "label": [0, 1]},
                features=datasets.Features(
                    {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
                ),
            )
            for split in ("train", "test")
        }
    )
    monkeypatch.setattr("sve.data.text_table.load_hub_dataset", lambda *_: labelled)
    named = TextTableData(hub_name="imdb", val_holdout=1)
    assert named.num_classes == 2 and named.class_names() == ["neg", "pos"]  # the hub's ClassLabel names
    glue = datasets.DatasetDict(
        {"train": labelled["train"], "test": datasets.Dataset.from_dict({"text": ["c"], "label": [-1]})}
    )
    monkeypatch.setattr("sve.data.text_table.load_hub_dataset", lambda *_: glue)
    with pytest.raises(
        InputError,
        match=r"label -1 is not .*; -1 marks an unlabelled example .* "
        r"dataset.test_split=validation",
    ):
        TextTableData(hub_name="glue", hub_config="sst2", val_holdout=1).check_data()
    monkeypatch.setattr("sve.data.text_table.load_hub_dataset", lambda *_: hub)
    with pytest.raises(InputError, match=r"someone/reviews has no split 'dev_test'; its splits are \['train', "):
        TextTableData(
            hub_name="someone/reviews", text_column="review", label_column="stars", test_split="dev_test"
        ).check_data()


def test_a_saved_datasets_directory_is_read_as_a_root(tmp_path):
    # datasets' save_to_disk layout (dataset_dict.json + arrow shards), with its ClassLabel names kept.
    import datasets

    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"text": ["good", "bad", "fine", "awful"], "label": [1, 0, 1, 0]}, features=features
            ),
            "test": datasets.Dataset.from_dict({"text": ["meh"], "label": [0]}, features=features),
        }
    ).save_to_disk(str(tmp_path / "saved"))
    data = TextTableData(root=str(tmp_path / "saved"), val_holdout=1)
    assert data.num_classes == 2 and data.class_names() == ["neg", "pos"] and data.parsed["test"] == [("meh", 0)]
    with pytest.raises(InputError, match=r"saved has no split 'dev'; its splits are \['train', 'test'\]"):
        TextTableData(root=str(tmp_path / "saved"), test_split="dev").check_data()


def image_dataset(labels: dict[str, list], names: list[str] | None = None):
    """A datasets.DatasetDict of 8x8 images whose colour encodes (split, row), with a ClassLabel when named."""
    import datasets

    label = datasets.ClassLabel(names=names) if names else datasets.Value("string")
    features = datasets.Features({"img": datasets.Image(), "y": label})
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "img": [
                        Image.new("L" if i % 2 else "RGB", (8, 8), (s * 40 + i) if i % 2 else (s * 40 + i, 0, 0))
                        for i in range(len(ys))
                    ],
                    "y": ys,
                },
                features=features,
            )
            for s, (split, ys) in enumerate(labels.items())
        }
    )


def test_a_hub_or_saved_image_dataset_reads_its_splits_labels_and_images(tmp_path, monkeypatch):
    hub = image_dataset({"train": [1, 0, 2, 1, 0, 2], "validation": [2], "test": [0, 1]}, ["cat", "dog", "eel"])
    monkeypatch.setattr("sve.data.image_folder.load_hub_dataset", lambda *_: hub)
    data = ImageFolderData(hub_name="someone/pets", image_column="img", label_column="y")
    assert data.num_classes == 3 and data.class_names() == ["cat", "dog", "eel"]  # the ClassLabel's names
    assert labels_of(data.parsed["test"]) == [0, 1] and labels_of(data.parsed["val"]) == [2]
    image, label = data.parsed["train"][1]
    assert image.mode == "RGB" and image.getpixel((0, 0)) == (1, 1, 1) and label == 0  # grey row 1 as RGB
    # The same splits saved to disk, with string labels (numbered in sorted order) and no validation split.
    image_dataset({"train": ["b", "a", "b", "a"], "test": ["a"]}).save_to_disk(str(tmp_path / "saved"))
    saved = ImageFolderData(root=str(tmp_path / "saved"), image_column="img", label_column="y", val_holdout=1)
    assert saved.num_classes == 2 and saved.class_names() == ["a", "b"] and labels_of(saved.parsed["test"]) == [0]
    assert len(saved.parsed["train"]) == 3 and len(saved.parsed["val"]) == 1


@pytest.mark.parametrize(
    "labels, options, message",
    [
        (
            {"train": ["a", "b"], "test": ["a"]},
            {},
            r"has no column \['image', 'label'\]; its columns are \['img', 'y'\]",
        ),
        (
            {"train": ["a", "b"], "valid": ["a"]},
            {"image_column": "img", "label_column": "y"},
            r"has no split 'test'; its splits are \['train', 'valid'\] \(dataset.test_split names the tested one\)",
        ),
        (
            {"train": ["a", "b"], "test": ["c"]},
            {"image_column": "img", "label_column": "y"},
            r"test, row 1: label 'c' is not one of the training split's labels \['a', 'b'\]",
        ),
        (
            {"train": ["a", "a"], "test": ["a"]},
            {"image_column": "img", "label_column": "y"},
            r"train has 1 distinct label\(s\) in column 'y'",
        ),
    ],
)
def test_a_bad_image_dataset_is_one_error_naming_what_is_wrong(monkeypatch, labels, options, message):
    monkeypatch.setattr("sve.data.image_folder.load_hub_dataset", lambda *_: image_dataset(labels))
    with pytest.raises(InputError, match=message):
        ImageFolderData(hub_name="someone/pets", val_holdout=1, **options).check_data()


def test_a_saved_image_dataset_trains_end_to_end(tmp_path):
    image_dataset({"train": ["b", "a"] * 6, "test": ["a", "b", "b"]}).save_to_disk(str(tmp_path / "saved"))
    done = run(
        compose_cfg(
            [
                "dataset=image_folder",
                f"dataset.root={tmp_path / 'saved'}",
                "dataset.image_column=img",
                "dataset.label_column=y",
                "backbone=tiny_vit",
                "method=sve",
                "ensemble_size=2",
                "trainer.max_epochs=1",
                "dataset.batch_size=4",
            ],
            tmp_path / "run",
        )
    )
    assert done["num_classes"] == 2 and done["class_names"] == ["a", "b"] and done["metrics"]["test/examples"] == 3


def test_a_max_length_beyond_the_models_position_table_is_refused_before_training(tmp_path):
    # tiny_bert has 256 learned positions: a longer max_length failed inside the model at the first long batch.
    long = " ".join(["word"] * 400)
    write_csv(tmp_path / "train.csv", [(long, "a"), ("short", "b"), (long, "a"), ("short", "b")])
    write_csv(tmp_path / "test.csv", [(long, "a"), ("short", "b")])
    base = [
        "dataset=text_table",
        f"dataset.root={tmp_path}",
        "dataset.val_holdout=1",
        "backbone=tiny_bert",
        "method=sve",
        "ensemble_size=2",
        "trainer.max_epochs=1",
        "dataset.batch_size=2",
    ]
    with pytest.raises(
        InputError,
        match=r"dataset.max_length=1000 is more than the 256 positions of the backbone's "
        r"learned position embeddings; set dataset.max_length to at most 256",
    ):
        run(compose_cfg([*base, "dataset.max_length=1000"], tmp_path / "too_long"))
    done = run(compose_cfg([*base, "dataset.max_length=null"], tmp_path / "as_long_as_it_can"))  # cut at 256
    assert done["metrics"]["test/examples"] == 2


def test_a_declared_class_count_is_checked_against_the_data_and_spares_the_plan_its_read(tmp_path):
    from hydra import compose, initialize_config_dir

    from sve.paths import CONFIGS
    from sve.runs import plan

    root = image_tree(tmp_path / "images", {"train": {"a": 2, "b": 2, "c": 2}, "test": {"a": 1}})
    with pytest.raises(
        InputError,
        match=r"dataset.num_classes=2 but .*train has 3 class folders; set "
        r"dataset.num_classes=3 or null",
    ):
        ImageFolderData(root=str(root), num_classes=2).check_data()
    declared = ImageFolderData(root=str(tmp_path / "absent"), num_classes=5)
    assert declared.num_classes == 5  # nothing read: the data is not even there
    with pytest.raises(InputError, match=r"dataset.num_classes=1 is not valid; expected an integer >= 2 or null"):
        TextTableData(root=str(tmp_path), num_classes=1)
    # plan=true reads the classes before its fake tensors (inside them, the read's seeded split could not run)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "dataset=image_folder",
                f"dataset.root={root}",
                "backbone=tiny_vit",
                "method=sve",
                "ensemble_size=2",
                "trainer=cpu",
            ],
        )
    found = plan.plan(cfg, alternatives=False)
    assert found.train_peak > 0


def test_an_image_folder_takes_shift_and_ood_options_as_every_image_dataset_does(tmp_path):
    # The docs promise dataset.corruptions=... on any image dataset; image_folder needed +dataset.corruptions.
    from sve.runs.run import instantiate

    images = image_tree(tmp_path / "images", {"train": {"a": 2, "b": 2}, "test": {"b": 1}})
    cfg = compose_cfg(
        [
            "dataset=image_folder",
            f"dataset.root={images}",
            "dataset.corruptions=[fog,snow]",
            "dataset.severities=2",
            "dataset.shift_size=1",
        ],
        tmp_path / "run",
    )
    data = instantiate(cfg.dataset)
    assert data.corruptions == ["fog", "snow"] and data.severities == [2] and cfg.dataset.ood is None
