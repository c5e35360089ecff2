"""results.json: everything needed to trust and reproduce one run's numbers."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "torchvision", "pytorch-lightning", "hydra-core", "timm", "transformers", "torchmetrics")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit(root: Path | None = None) -> str | None:
    """The commit of the checked-out code, with ``-dirty`` when a tracked file outside ``results/`` has
    uncommitted changes. Results are left out: committed runs and tables change under a running sweep
    (a table rebuilt, a resumed run's log) without changing what the code computes."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
            cwd=root, capture_output=True, text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


def write_json(path: Path, payload: dict) -> None:
    """Atomic write: a crash never leaves a half-written results file. NaN or infinity is an error (it is not
    JSON, and a number that is not one must not reach a table)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = json.dumps(payload, indent=2, sort_keys=False, default=str, allow_nan=False)
    except ValueError as err:
        raise ValueError(f"{path}: not written, the results hold a non-finite number ({err})") from None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def format_table(results: dict) -> str:
    """A small plain-text table of the headline metrics (acc and ECE in %, as the paper prints them)."""
    m = results["metrics"]
    rows = [
        ("method", results["method"]),
        ("backbone", results["backbone"]),
        ("dataset", results["dataset"]),
        ("ensemble_size", results["ensemble_size"]),
        ("seed", results["seed"]),
        ("acc (%)", f"{100 * m['test/acc']:.2f}"),
        ("ece (%)", f"{100 * m['test/ece']:.2f}"),
        ("nll", f"{m['test/nll']:.4f}"),
        ("brier", f"{m['test/brier']:.4f}"),
        ("trainable params", f"{results['parameters']['trainable']:,}"),
        ("wall time (s)", f"{results['wall_time_s']:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
