"""Training facts for the foundation methods (single, svf, sve) and the end-to-end run."""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sve.errors import InputError
from sve.methods import SVE, SVF, Single
from sve.runs.run import build, instantiate, run
from sve.training.module import EnsembleModule
from tests.conftest import ROOT, compose_cfg


def _tiny_text_batch(backbone, n=6):
    enc = backbone.tokenizer(
        ["a good movie"] * (n // 2) + ["bad plot"] * (n - n // 2), padding=True, return_tensors="pt"
    )
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "labels": torch.tensor([1] * (n // 2) + [0] * (n - n // 2)),
    }


def test_loss_is_mean_of_member_cross_entropies():
    backbone = instantiate(compose_cfg(["backbone=tiny_bert"]).backbone)
    method = SVE(backbone, ensemble_size=3, num_classes=2, sigma_init=0.05)
    batch = _tiny_text_batch(backbone)
    logits = method(batch)
    assert logits.shape == (3, 6, 2)
    expected = sum(F.cross_entropy(logits[m], batch["labels"]) for m in range(3)) / 3
    torch.testing.assert_close(method.loss(logits, batch["labels"]), expected)


def test_only_singular_values_member_biases_and_heads_change_and_stay_non_negative():
    cfg = compose_cfg(["backbone=tiny_vit", "method=sve", "ensemble_size=3"])
    backbone, datamodule, method, module = build(cfg)
    before = {n: p.detach().clone() for n, p in method.named_parameters()}
    opt = torch.optim.SGD(method.trainable_parameters(), lr=1e3)  # huge steps drive some values below 0
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    for _ in range(3):
        opt.zero_grad()
        method.loss(method(batch), batch["labels"]).backward()
        opt.step()
        method.constrain_()
    changed = {n for n, p in method.named_parameters() if not torch.equal(p, before[n])}

    def allowed(n):
        member_biases = n.endswith(".biases") and before[n].dim() == 2  # (M, out)
        return n.endswith("singular_values") or n.startswith("heads.") or member_biases

    assert changed and all(allowed(n) for n in changed), sorted(n for n in changed if not allowed(n))
    assert any(n.endswith("singular_values") for n in changed)
    assert any(n.endswith(".biases") for n in changed)
    values = torch.cat([layer.singular_values.flatten() for layer in method.sv_layers()])
    assert values.min() >= 0 and (values == 0).any()  # the constraint was active


def test_trainable_parameter_count_closed_form():
    backbone = instantiate(compose_cfg(["backbone=tiny_bert"]).backbone)
    M, C, D = 4, 3, 32
    method = SVE(backbone, ensemble_size=M, num_classes=C)
    # Per layer (2 layers): q, k, v, attn-out are 32x32 (r=32, bias 32); intermediate 64x32 (r=32, bias 64);
    # output 32x64 (r=32, bias 32).  Per member: singular values + biases; plus M heads of D*C + C.
    per_layer = 4 * (32 + 32) + (32 + 64) + (32 + 32)
    assert method.parameter_counts()["trainable"] == M * 2 * per_layer + M * (D * C + C)


def test_fixed_member_methods_warn_and_record_one_member():
    backbone = instantiate(compose_cfg(["backbone=tiny_bert"]).backbone)
    with pytest.warns(UserWarning, match="ensemble_size=4"):
        method = SVF(backbone, ensemble_size=4, num_classes=2)
    assert method.ensemble_size == 1 and all(layer.ensemble_size == 1 for layer in method.sv_layers())
    backbone = instantiate(compose_cfg(["backbone=tiny_bert"]).backbone)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Single(backbone, ensemble_size=1, num_classes=2).ensemble_size == 1


def test_single_trains_every_backbone_weight():
    backbone = instantiate(compose_cfg(["backbone=tiny_vit"]).backbone)
    method = Single(backbone, ensemble_size=1, num_classes=2)
    assert all(p.requires_grad for p in method.parameters())


def test_method_lr_overrides_recipe_lr():
    cfg = compose_cfg(["backbone=tiny_bert", "dataset=synthetic_text", "method=single", "optimizer.lr=0.5"])
    _, _, method, module = build(cfg)
    module.scheduler_factory = None
    assert module.configure_optimizers().param_groups[0]["lr"] == pytest.approx(1e-4)


@pytest.mark.parametrize("method", ["single", "svf", "sve"])
def test_fast_dev_run_writes_results(method, tmp_path):
    cfg = compose_cfg([f"method={method}", "backbone=tiny_bert", "dataset=synthetic_text", "ensemble_size=2"], tmp_path)
    results = run(cfg)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["method"] == method and saved["backbone"] == "tiny_bert"
    assert saved["ensemble_size"] == (2 if method == "sve" else 1)
    for key in ("test/acc", "test/ece", "test/nll", "test/brier"):
        assert 0 <= saved["metrics"][key] < 10
    assert len(saved["metrics"]["test/member_acc"]) == saved["ensemble_size"]
    assert saved["config"]["method"]["name"] == method
    assert saved["parameters"]["trainable"] == results["parameters"]["trainable"] > 0
    assert saved["versions"]["torch"].startswith("2.")
    assert not list(tmp_path.rglob("*.ckpt"))  # callbacks=none: no checkpoints, not even Lightning's default


def test_checkpoint_written_and_resumable(tmp_path):
    cfg = compose_cfg(["backbone=tiny_vit", "callbacks=default"], tmp_path)
    run(cfg)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.exists()
    # Training longer from a finished run's checkpoint changes its schedule: refused unless asked for.
    longer = ["backbone=tiny_vit", "callbacks=default", f"ckpt_path={last}", "trainer.max_epochs=2"]
    with pytest.raises(InputError, match=r"another config: trainer.max_epochs: 1 -> 2"):
        run(compose_cfg(longer, tmp_path / "refused"))
    results = run(compose_cfg([*longer, "resume_with_changes=true"], tmp_path / "resumed"))
    assert results["resumed_from"] == str(last) and results["metrics"]["test/acc"] >= 0


def test_multirun_sweeps_seeds_and_ensemble_sizes(tmp_path):
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "seed=0,1",
        "ensemble_size=1,2",
        "trainer=debug",
        "callbacks=none",
        "backbone=tiny_vit",
        f"hydra.sweep.dir={tmp_path}",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    found = sorted((p.parent.name, json.loads(p.read_text())["seed"]) for p in tmp_path.glob("*/results.json"))
    assert len(found) == 4
    results = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/results.json")}
    assert {r["ensemble_size"] for r in results.values()} == {1, 2}
    # One row per ensemble size, mean and sample std over the two seeds, from the runs' own numbers.
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_size = {next(o for o in g["overrides"] if o.startswith("ensemble_size")): g for g in summary["groups"]}
    assert sorted(by_size) == ["ensemble_size=1", "ensemble_size=2"]
    for size, group in by_size.items():
        accs = [r["metrics"]["test/acc"] for r in results.values() if f"ensemble_size={r['ensemble_size']}" == size]
        assert group["seeds"] == [0, 1] and group["metrics"]["test/acc"]["mean"] == pytest.approx(np.mean(accs))
        assert group["metrics"]["test/acc"]["std"] == pytest.approx(np.std(accs, ddof=1))
    assert "| ensemble_size=2 | 2 | 0 1 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "summary.csv").read_text().startswith("overrides,runs,seeds,")


def test_a_sweep_names_its_job_folders_by_the_member_count_the_run_records(tmp_path):
    # single records one member whatever ensemble_size says, so its two jobs keep ensemble_size in their names.
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "method=single,sve",
        "ensemble_size=2,3",
        "trainer=debug",
        "callbacks=none",
        "backbone=tiny_vit",
        f"hydra.sweep.dir={tmp_path}",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")) == [
        "single_m1_seed0_ensemble_size=2",
        "single_m1_seed0_ensemble_size=3",
        "sve_m2_seed0",
        "sve_m3_seed0",
    ]


def test_a_sweep_run_again_with_values_added_trains_only_the_new_runs(tmp_path):
    # Job folders are named by the job's settings, not its number: seed=0 is job 0 of the first sweep and job 1
    # of the second (seed=1,0 puts 1 first), and is not trained again.
    base = [
        sys.executable,
        "train.py",
        "-m",
        "method=sve",
        "ensemble_size=2",
        "trainer=debug",
        "callbacks=none",
        "backbone=tiny_vit",
        "sigma_init=0.01,0.02",
        f"hydra.sweep.dir={tmp_path}",
    ]
    subprocess.run([*base, "seed=0"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    first = {p.name: (p / "results.json").stat().st_mtime_ns for p in tmp_path.glob("sve_m2_seed*")}
    assert sorted(first) == ["sve_m2_seed0_sigma_init=0.01", "sve_m2_seed0_sigma_init=0.02"]
    done = subprocess.run([*base, "seed=1,0"], cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    assert done.stdout.count("has finished, skipping") + done.stderr.count("has finished, skipping") == 2
    assert {n: (tmp_path / n / "results.json").stat().st_mtime_ns for n in first} == first
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(r["run"] for r in summary["runs"]) == sorted(
        [*first, "sve_m2_seed1_sigma_init=0.01", "sve_m2_seed1_sigma_init=0.02"]
    )
    assert all(g["seeds"] == [0, 1] and "repeated_seeds_left_out" not in g for g in summary["groups"])


def test_module_rejects_unknown_aggregate():
    backbone = instantiate(compose_cfg(["backbone=tiny_vit"]).backbone)
    with pytest.raises(ValueError, match="aggregate"):
        EnsembleModule(SVE(backbone, 2, 2), optimizer=torch.optim.AdamW, aggregate="vote")
