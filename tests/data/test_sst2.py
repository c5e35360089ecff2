"""SST-2 loading from the real on-disk layout, and the synthetic data sets."""

import pytest
import torch

from sve.data import SST2Data, SyntheticImageData, SyntheticTextData
from sve.errors import InputError
from sve.runs.run import instantiate
from tests.conftest import compose_cfg, shared_path


def _write_sst2(root, n_train=20):
    root.mkdir(parents=True, exist_ok=True)
    lines = ["sentence\tlabel"] + [f'a "quoted" film , number {i} \t{i % 2}' for i in range(n_train)]
    (root / "train.tsv").write_text("\n".join(lines) + "\n")
    (root / "dev.tsv").write_text("sentence\tlabel\nit 's \" great \t1\nbad\t0\n")


def test_local_tsv_keeps_quotes_and_splits(tmp_path):
    _write_sst2(tmp_path)
    data = SST2Data(root=str(tmp_path), val_holdout=5)
    splits = data.load_splits()
    assert [len(splits[k]) for k in ("train", "val", "test")] == [15, 5, 2]
    assert splits["test"][0] == ("it 's \" great ", 1)  # QUOTE_NONE: quote characters are text
    assert {s for s, _ in splits["train"]}.isdisjoint({s for s, _ in splits["val"]})


def test_missing_files_error_names_key_and_layout(tmp_path):
    with pytest.raises(InputError, match=r"dataset.root=.*train.tsv.*sentence<TAB>label"):
        SST2Data(root=str(tmp_path)).load_splits()


def test_dynamic_padding_pads_to_longest_in_batch(tmp_path):
    _write_sst2(tmp_path)
    backbone = instantiate(compose_cfg(["backbone=tiny_bert"]).backbone)
    data = SST2Data(root=str(tmp_path), val_holdout=5, batch_size=2, max_length=256)  # tiny_bert has 256 positions
    data.attach(backbone)
    batch = data.collate([("ab", 0), ("abcdef", 1)])
    assert batch["input_ids"].shape == (2, 8)  # [CLS] + 6 characters + [SEP]
    assert batch["attention_mask"].sum(1).tolist() == [4, 8]
    assert batch["labels"].tolist() == [0, 1]


def test_modality_mismatch_is_an_error():
    backbone = instantiate(compose_cfg(["backbone=tiny_vit"]).backbone)
    with pytest.raises(ValueError, match="text data"):
        SyntheticTextData().attach(backbone)


def test_subsets_are_seeded(tmp_path):
    _write_sst2(tmp_path)
    a, b = (SST2Data(root=str(tmp_path), val_holdout=5, train_size=4, subset_seed=s) for s in (0, 0))
    a.setup(), b.setup()
    assert list(a.splits["train"]) == list(b.splits["train"]) and len(a.splits["train"]) == 4


def test_synthetic_data_is_deterministic_and_balanced():
    one, two = SyntheticImageData(seed=3).load_splits(), SyntheticImageData(seed=3).load_splits()
    torch.testing.assert_close(one["train"].tensors[0], two["train"].tensors[0])
    assert torch.bincount(one["train"].tensors[1]).tolist() == [16] * 4
    text = SyntheticTextData(seed=1).load_splits()
    assert [label for _, label in text["test"]].count(0) == 16


def test_shared_sst2_has_the_paper_sizes():
    root = shared_path("data", "sst2")
    splits = SST2Data(root=str(root)).load_splits()
    assert len(splits["train"]) + len(splits["val"]) == 67_349 and len(splits["test"]) == 872
    assert {label for _, label in splits["test"]} == {0, 1}
