"""No lost work: checkpoints during training, written atomically, holding only trainable state, with the
method's own state (posteriors, snapshots, ensemble rounds). Kills at several points of training and their
bit-exact resumption: tests/runs/test_reliability.py."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from sve.errors import InputError
from sve.layers.sv_linear import SVLinear
from sve.runs.run import run
from sve.training.checkpoint import LeanCheckpointing, read_checkpoint
from tests.conftest import compose_cfg


def test_checkpoint_holds_only_trainable_state_and_checks_the_frozen_part(tmp_path):
    cfg = compose_cfg(
        [
            "backbone=tiny_vit",
            "method=sve",
            "callbacks=default",
            "callbacks.checkpoint.every_n_steps=2",
            "trainer.limit_train_batches=5",
        ],
        tmp_path,
    )
    results = run(cfg)
    checkpoint = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 5  # epoch end, after the step checkpoints at 2 and 4
    saved = checkpoint["state_dict"]
    parameters = sum(v.numel() for k, v in saved.items() if "singular_values" in k or ".bias" in k or "heads" in k)
    assert parameters >= results["parameters"]["trainable"]
    frozen = checkpoint["frozen_fingerprint"]
    assert frozen and not set(frozen) & set(saved)  # U, V and frozen weights: only their fingerprint
    assert any(name.endswith(".U") or name.endswith(".V") for name in frozen) or len(frozen) > 10
    assert not list((tmp_path / "checkpoints").glob(".*tmp"))  # written, then renamed

    # Resuming onto a different frozen part (another seed draws another random backbone) fails clearly, even
    # when the changed config is accepted (resume_with_changes): the frozen tensors' fingerprints differ.
    cfg = compose_cfg(
        [
            "backbone=tiny_vit",
            "method=sve",
            "callbacks=default",
            "trainer.max_epochs=2",
            "seed=1",
            f"ckpt_path={tmp_path / 'checkpoints' / 'last.ckpt'}",
            "resume_with_changes=true",
        ],
        tmp_path / "other",
    )
    with pytest.raises(ValueError, match="frozen tensor.*differ.*config the run started with"):
        run(cfg)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated zip", bytes(range(256)) * 4])
def test_unreadable_checkpoint_is_a_clear_error(content, tmp_path):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"bad.ckpt \(\d+ bytes\) is not a readable checkpoint") as err:
        run(compose_cfg([f"ckpt_path={path}"], tmp_path / "run"))
    assert "weights_only=False" not in str(err.value)
    torch.save({"something": 1}, path)
    with pytest.raises(ValueError, match="not a Lightning training checkpoint"):
        run(compose_cfg([f"ckpt_path={path}"], tmp_path / "run2"))


def test_rerun_of_a_finished_laplace_run_reuses_its_posterior(tmp_path):
    # The last checkpoint is written again after after_fit, posterior included: running the same directory
    # again (results.json deleted, e.g. a crash in testing) restores it instead of fitting another one, and
    # samples the same predictive.
    overrides = [
        "backbone=tiny_bert",
        "dataset=synthetic_text",
        "method=bayes_lora_llla",
        "method.marglik_steps=3",
        "callbacks=default",
        "trainer.limit_train_batches=3",
    ]
    first = run(compose_cfg(overrides, tmp_path))
    checkpoint = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    laplace = [v for k, v in checkpoint["state_dict"].items() if k.endswith("_extra_state") and v.get("laplace")]
    assert len(laplace) == 1 and laplace[0]["laplace"]["cls_name"] == "KronLaplace"
    (tmp_path / "results.json").unlink()
    # 40 marginal-likelihood steps would give another prior precision than 3, had it been refitted.
    second = run(compose_cfg([*overrides, "method.marglik_steps=40", "resume_with_changes=true"], tmp_path))
    assert second["resumed_from"] == str(tmp_path / "checkpoints" / "last.ckpt")
    assert second["method_report"]["prior_precision"] == first["method_report"]["prior_precision"]
    drop = lambda r: {k: v for k, v in r["metrics"].items() if k != "test/seconds"}  # noqa: E731
    assert drop(second) == drop(first)


@pytest.mark.parametrize(
    ("method", "crash_after"),
    [
        ("checkpoint_ensemble", 7),  # epoch 3 of 3, after two epoch-end snapshots
        ("deep_ensemble", 8),  # sequential: round 2 (one member per round), its second epoch
    ],
)
def test_method_state_survives_a_crash(method, crash_after, tmp_path):
    # Snapshots and ensemble rounds live in the checkpoint: a run that crashes and is started again in its
    # directory ends with the members, and the metrics, of the run that never crashed.
    overrides = [
        "backbone=tiny_vit",
        "dataset=synthetic_image",
        f"method={method}",
        "ensemble_size=2",
        "trainer=cpu",
        "trainer.max_epochs=3",
        "callbacks=default",
        "callbacks.checkpoint.every_n_steps=1",
        "dataset.num_train=24",
        "dataset.num_val=8",
        "dataset.num_test=16",
        "dataset.batch_size=8",
    ]
    if method == "deep_ensemble":
        overrides += ["method.mode=sequential", "method.chunk_size=1"]
    whole = run(compose_cfg(overrides, tmp_path / "whole"))
    crash = [
        "+callbacks.crash._target_=tests.helpers.Crash",
        f"+callbacks.crash.after_batches={crash_after}",
        f"+callbacks.crash.marker={tmp_path / 'crashed'}",
    ]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_cfg([*overrides, *crash], tmp_path / "crashed_run"))
    assert not (tmp_path / "crashed_run" / "results.json").exists()
    resumed = run(compose_cfg([*overrides, *crash], tmp_path / "crashed_run"))  # the marker: no second crash
    assert resumed["resumed_from"] is not None
    assert resumed["num_members"] == whole["num_members"] == 2
    drop = lambda r: {k: v for k, v in r["metrics"].items() if k != "test/seconds"}  # noqa: E731
    assert drop(resumed) == drop(whole)


class _Lean(LeanCheckpointing, torch.nn.Module):
    """An SV layer beside a frozen embedding, checkpointed as the training module is."""

    def __init__(self, linear_seed: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(5, 8).requires_grad_(False)
        torch.manual_seed(linear_seed)
        self.sv = SVLinear.from_linear(torch.nn.Linear(8, 6), 3, sigma_init=0.01)


def _saved(model: torch.nn.Module) -> dict:
    checkpoint = {"state_dict": model.state_dict()}
    model.on_save_checkpoint(checkpoint)
    return checkpoint


def _by_bytes(model: torch.nn.Module) -> dict:
    """The fingerprint checkpoints wrote before factors were named by their source: every frozen tensor's bytes."""
    return {
        n: [
            list(p.shape),
            str(p.dtype).removeprefix("torch."),
            hashlib.sha256(p.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest(),
        ]
        for n, p in model.named_parameters()
        if not p.requires_grad
    }


def test_svd_factors_are_named_by_their_source_so_a_checkpoint_loads_on_another_machine(caplog):
    """U and V^T differ in their last bits between machines (MKL and ATen code paths by instruction set), so a
    checkpoint names them by the weight they come from: factors with other bits load, another weight is refused,
    and an older checkpoint (bytes) loads with a warning while its other frozen tensors are still checked."""
    model = _Lean()
    checkpoint = _saved(model)
    assert checkpoint["frozen_fingerprint"]["sv.U"][2].startswith("computed from ")
    assert "sv.U" not in checkpoint["state_dict"] and "sv.singular_values" in checkpoint["state_dict"]
    elsewhere = _Lean()
    with torch.no_grad():
        elsewhere.sv.U.mul_(1 + 1e-6)  # the same SVD on another machine: other last bits
    elsewhere.on_load_checkpoint(_saved(model))
    with pytest.raises(InputError, match=r"2 frozen tensor\(s\) differ.*sv\.U"):
        _Lean(linear_seed=1).on_load_checkpoint(_saved(model))  # the same embedding, another weight decomposed

    legacy = _saved(model)
    legacy["frozen_fingerprint"] = _by_bytes(model)
    with caplog.at_level(logging.WARNING):
        elsewhere.on_load_checkpoint(legacy)
    assert "source), and 1 differ here, e.g. sv.U:" in caplog.text  # V^T kept its bits
    with torch.no_grad():
        elsewhere.embed.weight.add_(1.0)
    elsewhere._fingerprint = None
    with pytest.raises(InputError, match=r"1 frozen tensor\(s\) differ, e\.g\. embed\.weight"):
        elsewhere.on_load_checkpoint(legacy)


def test_a_top_rank_layer_names_its_residual_by_the_same_svd():
    """The top-r layer's frozen residual W - U_r S_r V_r^T comes from the same SVD as its factors: one source."""
    from sve.layers.sv_top import SVTopLinear
    from sve.training.checkpoint import frozen_fingerprint

    torch.manual_seed(0)
    top = SVTopLinear.from_linear_top(torch.nn.Linear(8, 6), 2, 3, sigma_init=0.01)
    identities = {name: entry[2] for name, entry in frozen_fingerprint(top).items()}
    assert set(identities) == {"U", "Vh", "residual"} and len(set(identities.values())) == 1
    assert identities["U"].startswith("computed from ") and identities["U"].endswith(" top 2")
