"""Adapter files: a trained ensemble saved with ``save_pretrained`` and rebuilt on a fresh copy of its base
with ``from_pretrained`` is the same ensemble (every tensor of its state, U and V recomputed); the file holds
the trainable tensors only; a different base is refused before any SVD; the Hub path round-trips."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import sve
from sve.api import adapter_files
from sve.api.options import method_names
from sve.errors import InputError

torch.set_num_threads(1)


def base() -> nn.Module:
    torch.manual_seed(0)  # the same base every call: what a user reloads from its hub id
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Dropout(0.1), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3))


def trained(method: str, **options):
    torch.manual_seed(1)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    ensemble = sve.wrap(base(), method, ensemble_size=2, num_classes=4, example_input=x, **options)
    optimizer = torch.optim.SGD(ensemble.trainable_parameters(), lr=0.2)
    for _ in range(3):
        loss = ensemble.loss(ensemble(x), y.clamp_max(3))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ensemble.end_epoch()
    ensemble.finish_training([(x, y)], batch_size=16)
    return ensemble, x


@pytest.mark.parametrize("method", method_names())
def test_a_saved_ensemble_is_rebuilt_exactly_on_a_fresh_base(method, tmp_path):
    ensemble, x = trained(method)
    ensemble.save_pretrained(tmp_path)
    loaded = sve.from_pretrained(base(), tmp_path)
    state, again = ensemble.method.state_dict(), loaded.method.state_dict()
    assert sorted(state) == sorted(again)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, again[key]), key
    ensemble.eval(), loaded.eval()
    with torch.no_grad():  # the same draws for the random members (dropout passes, posterior samples)
        torch.manual_seed(5)
        expected = ensemble(x)
        torch.manual_seed(5)
        assert torch.equal(expected, loaded(x))


def test_wrapping_a_model_in_training_mode_leaves_its_batchnorm_statistics_and_its_adapter_reloads(tmp_path):
    # torchvision and most user models are built in training mode: the probe forwards that find the head and
    # the features must not update BatchNorm's running statistics, or the model (and its fingerprint) change.
    def cnn() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 3),
        )

    model, x = cnn(), torch.randn(4, 3, 8, 8)
    assert model.training
    before = {k: v.clone() for k, v in model[1].state_dict().items()}
    ensemble = sve.wrap(model, "sve", ensemble_size=2, example_input=x)
    for key, value in model[1].state_dict().items():
        assert torch.equal(value, before[key]), key
    ensemble.save_pretrained(tmp_path)
    loaded = sve.from_pretrained(cnn(), tmp_path)  # a probe that changed the statistics would fail the fingerprint
    ensemble.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(ensemble(x), loaded(x))


def test_the_file_holds_what_training_changed_and_nothing_else(tmp_path):
    ensemble, _ = trained("sve", sigma_init=0.01)
    ensemble.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / adapter_files.TENSORS))
    trainable = {n for n, p in ensemble.method.named_parameters() if p.requires_grad}
    assert set(tensors) == trainable
    assert not any(k.endswith((".U", ".Vh", "pretrained_singular_values")) for k in tensors)
    counts = ensemble.parameter_counts()
    assert sum(t.numel() for t in tensors.values()) == counts["trainable"] < counts["stored"]
    config = json.loads((tmp_path / adapter_files.CONFIG).read_text())
    assert config["method"] == "sve" and config["ensemble_size"] == 2 and config["options"]["sigma_init"] == 0.01
    assert config["trainable_parameters"] == counts["trainable"]


def test_another_base_is_refused_before_any_svd(tmp_path, monkeypatch):
    ensemble, _ = trained("sve")
    ensemble.save_pretrained(tmp_path)
    other = base()
    with torch.no_grad():
        other[3].weight[0, 0] += 1e-3  # one weight differs (a sampled value: 144 values, all sampled)
    import sve.layers.sv_linear as sv_linear

    monkeypatch.setattr(sv_linear, "decompose", lambda *a, **k: pytest.fail("an SVD ran before the check"))
    modules = [(n, type(m)) for n, m in other.named_modules()]
    with pytest.raises(InputError, match="trained on another base model"):
        sve.from_pretrained(other, tmp_path)
    assert [(n, type(m)) for n, m in other.named_modules()] == modules  # its head is back, nothing half-loaded


def test_a_missing_or_foreign_directory_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no adapter_config.json"):
        sve.from_pretrained(base(), tmp_path)
    (tmp_path / adapter_files.CONFIG).write_text('{"format": "peft"}')
    with pytest.raises(InputError, match="is not an SVE adapter config"):
        sve.from_pretrained(base(), tmp_path)
    with pytest.raises(InputError, match="no adapter directory there"):
        sve.from_pretrained(base(), tmp_path / "absent")


def test_the_hub_round_trip_goes_through_huggingface_hub(tmp_path, monkeypatch):
    """Offline: the Hub is a local directory behind the two calls the module makes."""
    import huggingface_hub

    remote = tmp_path / "hub"

    class FakeApi:
        def create_repo(self, repo_id, exist_ok, private):
            (remote / repo_id).mkdir(parents=True, exist_ok=exist_ok)

        def upload_folder(self, repo_id, folder_path):
            for f in sorted(__import__("pathlib").Path(folder_path).iterdir()):
                (remote / repo_id / f.name).write_bytes(f.read_bytes())

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id: str(remote / repo_id))
    ensemble, x = trained("lora_ensemble")
    ensemble.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="someone/mlp-lora")
    assert (remote / "someone/mlp-lora" / adapter_files.TENSORS).is_file()
    loaded = sve.from_pretrained(base(), "someone/mlp-lora")
    ensemble.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(ensemble(x), loaded(x))


def test_a_model_that_refuses_zero_token_ids_reloads_from_the_example_it_was_wrapped_with(tmp_path):
    # BART's classifier reads the features at the end-of-sequence token and refuses ids without one: the probe
    # of from_pretrained must use the wrap's example ids, not ids of zeros of their shape.
    from transformers import BartConfig, BartForSequenceClassification

    def bart() -> nn.Module:
        torch.manual_seed(0)
        config = BartConfig(
            vocab_size=40,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=32,
            num_labels=3,
        )
        return BartForSequenceClassification(config).eval()

    ids = torch.tensor([[0, 7, 9, 11, 2], [0, 5, 6, 8, 2]])  # <s> ... </s>
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ensemble = sve.wrap(bart(), "sve", ensemble_size=2, example_input=batch)
    ensemble.save_pretrained(tmp_path)
    loaded = sve.from_pretrained(bart(), tmp_path)
    ensemble.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(ensemble(**batch), loaded(**batch))
    recorded = json.loads((tmp_path / adapter_files.CONFIG).read_text())["example_input"]["input_ids"]
    # The first example's structure only: <s> (0) and </s> (2) where they were, every other token one filler (3,
    # the smallest id BART does not name special): a shared adapter never holds the user's text.
    assert recorded == {"shape": [1, 5], "dtype": "int64", "values": [0, 3, 3, 3, 2]}


def wide() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 3))


def test_a_base_that_differs_in_one_unsampled_weight_of_a_wide_layer_is_refused(tmp_path):
    # The fingerprint of version 1 hashed 1,024 evenly spaced values per tensor: in the 16,384 weights of a
    # 256 x 64 layer it read every 16th, so this base passed and predicted differently. Every value counts now.
    from sve.backbones.base import fingerprint

    x = torch.randn(4, 64)
    sve.wrap(wide(), "sve", ensemble_size=2, num_classes=3, example_input=x).save_pretrained(tmp_path)
    other = wide()
    with torch.no_grad():
        other[0].weight[0, 1] += 0.5  # flat index 1: between the sampled indices 0 and 16
    assert fingerprint(other, without="2").sampled == fingerprint(wide(), without="2").sampled
    with pytest.raises(InputError, match="trained on another base model"):
        sve.from_pretrained(other, tmp_path)
    assert json.loads((tmp_path / adapter_files.CONFIG).read_text())["version"] == 2


def test_a_file_of_version_1_is_checked_with_its_sampled_fingerprint_and_a_warning(tmp_path):
    x = torch.randn(4, 64)
    ensemble = sve.wrap(wide(), "sve", ensemble_size=2, num_classes=3, example_input=x)
    ensemble.save_pretrained(tmp_path)
    config = json.loads((tmp_path / adapter_files.CONFIG).read_text())
    config.update(version=1, base_fingerprint=ensemble.method.base_fingerprint.sampled)  # as version 1 wrote it
    (tmp_path / adapter_files.CONFIG).write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="sampled 1,024 values per tensor"):
        loaded = sve.from_pretrained(wide(), tmp_path)
    ensemble.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(ensemble(x), loaded(x))
    other = wide()
    with torch.no_grad():
        other[0].weight[0, 0] += 0.5  # a sampled value: version 1 detects this one
    with pytest.warns(UserWarning), pytest.raises(InputError, match="trained on another base model"):
        sve.from_pretrained(other, tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing"])
def test_a_damaged_or_missing_tensor_file_is_named_before_any_svd(damage, tmp_path, monkeypatch):
    ensemble, _ = trained("sve")
    ensemble.save_pretrained(tmp_path)
    path = tmp_path / adapter_files.TENSORS
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a safetensors file" * 4)
    import sve.layers.sv_linear as sv_linear

    monkeypatch.setattr(sv_linear, "decompose", lambda *a, **k: pytest.fail("an SVD ran before the file was read"))
    with pytest.raises(
        InputError,
        match=rf"{path}: no such file" if damage == "missing" else rf"{path} is not a readable safetensors file",
    ):
        sve.from_pretrained(base(), tmp_path)


def test_a_base_of_another_input_size_is_refused_by_its_fingerprint_not_a_matmul(tmp_path):
    ensemble, _ = trained("sve")
    ensemble.save_pretrained(tmp_path)
    torch.manual_seed(0)
    other = nn.Sequential(nn.Linear(7, 12), nn.Tanh(), nn.Dropout(0.1), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3))
    modules = [(n, type(m)) for n, m in other.named_modules()]
    with pytest.raises(InputError, match="trained on another base model"):  # the probe on (1, 6) fails inside
        sve.from_pretrained(other, tmp_path)
    assert [(n, type(m)) for n, m in other.named_modules()] == modules


def test_from_pretrained_on_the_wrapped_model_itself_says_it_is_already_wrapped(tmp_path):
    model = base()
    ensemble = sve.wrap(model, "sve", ensemble_size=2, num_classes=3, example_input=torch.randn(2, 6))
    ensemble.save_pretrained(tmp_path)
    with pytest.raises(InputError, match=r"Sequential is already wrapped .*from_pretrained needs the base model"):
        sve.from_pretrained(model, tmp_path)


def test_an_adapter_written_in_shards_reads_back_whole_and_each_file_keeps_the_limit(tmp_path):
    # A run with adapter.shard_mb writes shards and an index, so that a repository that takes no large file keeps
    # it; the reader gives the same tensors as one file, and a missing shard is named.
    ensemble, x = trained("sve")
    tensors, _ = adapter_files.trained_state(ensemble.method)
    whole = sum(t.numel() * t.element_size() for t in tensors.values())
    limit = adapter_files.HEADER_ROOM + whole // 3  # about three shards
    adapter_files.write_adapter(ensemble.method, tmp_path / "one", {})
    adapter_files.write_adapter(ensemble.method, tmp_path / "sharded", {}, max_shard_bytes=limit)
    files = sorted((tmp_path / "sharded").glob("adapter_model-*-of-*.safetensors"))
    assert len(files) >= 3 and not (tmp_path / "sharded" / adapter_files.TENSORS).exists()
    assert all(f.stat().st_size <= limit for f in files)
    index = json.loads((tmp_path / "sharded" / adapter_files.INDEX).read_text())
    assert sorted(index["weight_map"]) == sorted(tensors) and index["metadata"]["total_size"] == whole
    read, _ = adapter_files.read_trained_state(tmp_path / "sharded")
    assert sorted(read) == sorted(tensors) and all(torch.equal(read[k], tensors[k]) for k in tensors)
    assert load_file(str(tmp_path / "one" / adapter_files.TENSORS)).keys() == read.keys()
    # Written again without a limit: one file, and no shard of the earlier write is left to be read.
    adapter_files.write_adapter(ensemble.method, tmp_path / "sharded", {})
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
    adapter_files.write_adapter(ensemble.method, tmp_path / "cut", {}, max_shard_bytes=limit)
    sorted((tmp_path / "cut").glob("adapter_model-*.safetensors"))[1].unlink()
    with pytest.raises(InputError, match=r"adapter_model-00002-of-000\d\d.safetensors: no such file"):
        adapter_files.read_trained_state(tmp_path / "cut")


def test_an_unwritable_adapter_directory_is_one_line_naming_it(tmp_path, monkeypatch):
    import safetensors.torch

    ensemble, _ = trained("sve")
    failing = type("SafetensorError", (Exception,), {})  # safetensors' own type, raised from Rust

    def read_only(*args, **kwargs):
        raise failing("Error while serializing: IoError(Os { code: 30, kind: ReadOnlyFilesystem })")

    monkeypatch.setattr(safetensors.torch, "save_file", read_only)
    with pytest.raises(InputError, match=rf"adapter directory {tmp_path / 'out'} cannot be written .*writable"):
        ensemble.save_pretrained(tmp_path / "out")
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(InputError, match=r"cannot be written \(FileExistsError"):
        adapter_files.write_adapter(ensemble.method, blocked, {})


def test_wrap_keeps_the_models_mode():
    # A model loaded in eval mode (transformers' from_pretrained) ran dropout at the first call after wrapping.
    for training in (False, True):
        ensemble = sve.wrap(base().train(training), "sve", ensemble_size=2, example_input=torch.randn(1, 6))
        assert ensemble.training is training
        assert all(m.training is training for m in ensemble.modules() if isinstance(m, nn.Dropout))
