"""The ``distributed`` part of ``sve-bench --gpu-check`` (2 or more GPUs): DDP and FSDP over NCCL train to what
one process trains, by the CPU tests' criteria (tests/training/test_ddp.py, tests/training/test_fsdp.py, whose
runs over gloo these repeat on GPUs).

Every method under ``trainer=ddp`` and Single, SVE and a sequential deep ensemble under ``trainer=fsdp``, on 2
GPUs, against the same configs under ``trainer=gpu`` (one process): tiny ViT, synthetic images, 2 epochs of 3
steps, 21 test examples (11 on rank 0, 10 plus one padding example on rank 1), in float32
(``precision=32-true``, TF32 off through ``NVIDIA_TF32_OVERRIDE=0``) as the CPU tests run. Criteria: rank 0
saved every test example once in order; member logits within ``DISTRIBUTED_CRITERIA`` (``sve.bench.gpu_report``);
under DDP test accuracy and member accuracies equal, NLL, Brier and ECE within 1e-5 relative.

``python -m sve.cli.gpu_ranks OUT_DIR 'overrides of run 1' ...`` runs configs one after another in one
process group (as tests/ddp_runner.py does): Lightning starts the second rank by running the same command
again; each run writes OUT_DIR/<i>/results.json, or failed.json when it fails.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from sve.bench.gpu_report import DISTRIBUTED_CRITERIA, Check
from sve.methods import registry

# As tests/training/test_ddp.py's DATA: two epochs of 3 steps, checkpoints mid-epoch, 21 test examples.
DATA = [
    "backbone=tiny_vit",
    "dataset=synthetic_image",
    "ensemble_size=2",
    "trainer.max_epochs=2",
    "callbacks=default",
    "callbacks.checkpoint.every_n_steps=2",
    "dataset.num_train=24",
    "dataset.num_val=8",
    "dataset.num_test=21",
]
FSDP_METHODS = [["method=single"], ["method=sve"], ["method=deep_ensemble", "method.mode=sequential"]]
TEST_EXAMPLES = 21


def run_overrides(method: list[str], trainer: str, out: Path) -> list[str]:
    name = method[0].split("=", 1)[1]
    extra = ["method.marglik_steps=3"] if "marglik_steps" in registry.option_config(name) else []
    devices = ["++trainer.devices=2"] if trainer in ("ddp", "fsdp") else []
    return [
        "logger=csv",
        f"paths.output_dir={out}",
        *method,
        f"trainer={trainer}",
        *devices,
        "++trainer.precision=32-true",
        "++trainer.enable_progress_bar=false",
        *DATA,
        *extra,
    ]


def launch(out_dir: Path, runs: list[list[str]]) -> None:
    """The runs in one (process group of) ``python -m sve.cli.gpu_ranks``; each run's outcome is its files."""
    env = {**os.environ, "NVIDIA_TF32_OVERRIDE": "0"}
    cmd = [sys.executable, "-m", "sve.cli.gpu_ranks", str(out_dir), *(shlex.join(r) for r in runs)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the runs in {out_dir} stopped: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def outcome(run_dir: Path) -> dict | str:
    """results.json, or the failure's last line."""
    results, failure = run_dir / "results.json", run_dir / "failed.json"
    if results.exists():
        return json.loads(results.read_text())
    if failure.exists():
        return json.loads(failure.read_text())["traceback"].strip().splitlines()[-1]
    return "no results.json and no failed.json"


def compare_runs(distributed: Path, alone: Path, rtol: float, atol: float, metrics: bool) -> tuple[bool, str]:
    """(passed, detail): the CPU tests' criteria for a multi-process run against one process."""
    a, b = outcome(distributed), outcome(alone)
    if isinstance(a, str) or isinstance(b, str):
        said = lambda r: r if isinstance(r, str) else "ran"  # noqa: E731
        return False, f"distributed: {said(a)}; one process: {said(b)}"
    problems = []
    if a["hardware"]["devices"] != 2 or a["metrics"]["test/examples"] != TEST_EXAMPLES:
        problems.append(f"{a['hardware']['devices']} devices, {a['metrics']['test/examples']} test examples")
    saved, single = (np.load(d / "predictions" / "test.npz") for d in (distributed, alone))
    if saved["index"].tolist() != list(range(TEST_EXAMPLES)):
        problems.append("test examples not saved once each in order")
    x, y = saved["member_logits"], single["member_logits"]
    worst = float(np.max(np.abs(x - y) - rtol * np.abs(y))) if x.shape == y.shape else np.inf
    if not (x.shape == y.shape and np.allclose(x, y, rtol=rtol, atol=atol)):
        problems.append(f"member logits differ: max |a - b| - rtol |b| = {worst:.2e} > atol {atol:.0e}")
    if metrics:
        ma, mb = a["metrics"], b["metrics"]
        for key in ("test/acc", "test/member_acc"):
            if ma[key] != mb[key]:
                problems.append(f"{key} {ma[key]} != {mb[key]}")
        for key in ("test/nll", "test/brier", "test/ece"):
            if abs(ma[key] - mb[key]) > 1e-5 * abs(mb[key]) + 1e-7:
                problems.append(f"{key} {ma[key]:.6g} != {mb[key]:.6g}")
    return not problems, "; ".join(problems) or f"member logits within rtol {rtol:.0e}, atol {atol:.0e}"


def distributed_part(scratch: Path) -> list[Check]:
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 2:
        return [
            Check(
                "distributed",
                "DDP and FSDP over NCCL equal one process",
                None,
                f"needs 2 or more GPUs; this machine has {gpus}",
            )
        ]
    ddp = [[f"method={m}"] for m in registry.options()]
    groups = {"ddp": ddp, "fsdp": FSDP_METHODS}
    checks = []
    for trainer, methods in groups.items():
        print(f"[distributed] {trainer}: {len(methods)} runs on 2 GPUs, then one process each", flush=True)
        for kind, where in ((trainer, scratch / trainer), ("gpu", scratch / f"{trainer}_alone")):
            launch(where, [run_overrides(m, kind, where / str(i)) for i, m in enumerate(methods)])
        for i, method in enumerate(methods):
            name = method[0].split("=", 1)[1]
            # A posterior fitted after training, on every rank's share of the data: its own tolerance.
            key = "ddp_laplace" if trainer == "ddp" and registry.info(name).fits_after_training else trainer
            passed, detail = compare_runs(
                scratch / trainer / str(i),
                scratch / f"{trainer}_alone" / str(i),
                *DISTRIBUTED_CRITERIA[key],
                metrics=trainer == "ddp",
            )
            checks.append(
                Check("distributed", f"{' '.join(method)} under {trainer} (NCCL, 2 GPUs) = one process", passed, detail)
            )
    return checks


def run_all(out_dir: str, runs: list[str]) -> None:
    """Each of ``runs`` (one string of overrides each) trained in turn in this process (group), its outcome
    written to ``<out_dir>/<i>/`` (``python -m sve.cli.gpu_ranks``, which ``launch`` starts)."""
    from sve.runs.multirun import record_failure
    from sve.runs.resolvers import compose_run
    from sve.runs.run import run

    for i, overrides in enumerate(runs):
        run_dir = Path(out_dir) / str(i)
        try:
            run(compose_run(shlex.split(overrides)))
        except Exception as err:  # noqa: BLE001 - recorded for the parent to read
            run_dir.mkdir(parents=True, exist_ok=True)
            record_failure(run_dir, err)
