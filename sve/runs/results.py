"""results.json: everything needed to trust and reproduce one run's numbers."""

from __future__ import annotations

import errno
import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from sve import MOVED
from sve.errors import InputError
from sve.runs.writable import atomic_write

PACKAGES = ("torch", "torchvision", "pytorch-lightning", "hydra-core", "timm", "transformers", "torchmetrics")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


# Settings that choose the numeric code paths of MKL, ATen and oneDNN (and their threads); each changes last bits.
NUMERIC_ENV = (
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUBLAS_WORKSPACE_CONFIG",
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numerics() -> dict:
    """What decides a run's last digits besides its code, config and package versions: the CPU and the kernel
    code paths it selects (ATen's vectorised kernels by instruction set, MKL's and oneDNN's own dispatch; an
    AVX2 machine and an AVX-512 one differ from the 7th digit on), their threads and the settings that pin them,
    and the GPU. Two runs agree to the last digit only where this record does too."""
    import torch

    record = {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in NUMERIC_ENV if k in os.environ},
    }
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name()
        record["cuda"] = torch.version.cuda
        record["cudnn"] = torch.backends.cudnn.version()
    return record


def relative_difference(a, b) -> float:
    """The largest |a - b| / max(|a|, |b|) over two metric values of the same structure (numbers or nested lists);
    inf where the structures differ or a value is missing."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return max((relative_difference(x, y) for x, y in zip(a, b)), default=0.0) if len(a) == len(b) else math.inf
    if isinstance(a, int | float) and isinstance(b, int | float):
        scale = max(abs(a), abs(b))
        return abs(a - b) / scale if scale else 0.0
    return 0.0 if a == b else math.inf


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
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


def write_json(path: Path, payload: dict) -> None:
    """Atomic write (``sve.runs.writable.atomic_write``): a crash or a full disk never leaves a half-written file,
    the previous file stays as it was, and a full disk or a read-only directory is an ``InputError`` naming
    the file and the space left. NaN or infinity is an error (it is not JSON, and a number that is not one
    must not reach a table)."""
    path = Path(path)
    try:
        text = json.dumps(payload, indent=2, sort_keys=False, default=str, allow_nan=False)
    except ValueError as err:
        raise ValueError(f"{path}: not written, the results hold a non-finite number ({err})") from None
    data = (text + "\n").encode()
    atomic_write(path, lambda f: f.write(data), needed=len(data))


class UnreadableFile(InputError):
    """A stored file (a run's results.json, a row's tuned.json, ...) that cannot be read or is not what it
    should be; ``path`` is the file. The message names it, says what is wrong and how to recover."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = Path(path)


def read_json(path: Path, fix: str) -> dict:
    """The JSON object stored in ``path``; ``UnreadableFile`` when it cannot be read, is not valid JSON (the
    position named: a file cut short ends there) or holds something other than an object. ``fix`` ends the
    message: what to do about it (e.g. "delete it to ...")."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        reason = f"{err.strerror or err} ({errno.errorcode.get(err.errno, err.errno)})" if err.errno else str(err)
        raise UnreadableFile(f"{path} cannot be read: {reason}; {fix}", path) from None
    if not raw.strip():
        raise UnreadableFile(
            f"{path} is empty ({len(raw)} bytes), not valid JSON: it was cut short (a full disk, "
            f"a killed process or copy); {fix}",
            path,
        )
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UnreadableFile(
            f"{path} ({len(raw)} bytes) is not valid JSON: not UTF-8 text (byte {err.start}); {fix}", path
        ) from None
    except json.JSONDecodeError as err:
        cut = ", where it ends: it was cut short" if err.pos >= len(err.doc.rstrip()) else ""
        raise UnreadableFile(
            f"{path} ({len(raw)} bytes) is not valid JSON: {err.msg} at line {err.lineno} column "
            f"{err.colno} (char {err.pos}){cut}; {fix}",
            path,
        ) from None
    if not isinstance(value, dict):
        raise UnreadableFile(f"{path} holds a JSON {type(value).__name__}, not an object ({{...}}); {fix}", path)
    return value


def rerun_hint(path: Path) -> str:
    """What to do about a run's unreadable results.json: delete it to run the run again."""
    return f"delete it (or the run directory {Path(path).parent}) to run that run again"


# results.json's format: every record written carries it (``results_record``), every file read is brought to it
# (``migrate``), so readers see one shape and hold no branches for older files.
FORMAT = 1


def provenance(config: dict, commit: str | None) -> dict:
    """How a record was produced: the command, the commit of the code, package versions, what decides the last
    digits (``numerics``) and the resolved config."""
    return {
        "command": command_line(),
        "git_commit": commit,
        "versions": package_versions(),
        "numerics": numerics(),
        "config": config,
    }


def results_record(fields: dict, config: dict, commit: str | None) -> dict:
    """A results record (a run's results.json, a re-evaluation's or a distilled student's): the format, then
    ``fields`` in their order, then ``provenance``. Every writer of a record builds it here."""
    return {"format": FORMAT, **fields, **provenance(config, commit)}


# The parts of the evaluation record (sve.runs.evaluation) that a run's results.json keeps as they are.
EVALUATION_RECORDS = ("predictions", "reliability", "risk_coverage", "conformal", "shift", "shifted")


def run_record(
    cfg,
    method,
    datamodule,
    trainer,
    evaluation: dict,
    *,
    curve: dict | None,
    resumed_from: str | None,
    config_changes: list,
    wall_time_s: float,
    commit: str | None,
) -> dict:
    """A training run's results.json (``results_record``): what was trained on what, the evaluation's metrics and
    records, the parameter counts, the method's report, the hardware, the learning curve (``curve``: validation
    metrics during training) and the resume (``config_changes``: accepted with resume_with_changes=true)."""
    from omegaconf import OmegaConf

    from sve.metrics.scores import UNITS  # torch: the readers of results.json import this module without it

    fields = {
        "method": cfg.method.name,
        "backbone": cfg.backbone.name,
        "dataset": cfg.dataset.name,
        "ensemble_size": method.ensemble_size,
        "num_members": evaluation["num_members"],  # members or samples that produced the predictive
        "num_classes": method.num_classes,
        "class_names": datamodule.class_names(),  # label i is class_names[i]; None where the data has no names
        "seed": int(cfg.seed),
        "recipe": cfg.get("recipe", "none"),  # the Table 7 recipe the dataset selected (configs/recipe)
        "experiment": cfg.get("experiment_name"),
        "aggregate": cfg.aggregate,
        "metrics": evaluation["metrics"],  # test/... and val/... (the only ones tuning may use)
        "units": {f"test/{k}": v for k, v in UNITS.items()},
        **{k: evaluation[k] for k in EVALUATION_RECORDS if k in evaluation},
        "parameters": {**method.parameter_counts(), "backbone": getattr(method, "base_parameter_count", None)},
        "method_report": method.report(),
        "hardware": hardware_record(trainer, datamodule),
        "curve": curve,
        "resumed_from": resumed_from,
        "config_changes_on_resume": config_changes,
        "wall_time_s": wall_time_s,
    }
    return results_record(fields, OmegaConf.to_container(cfg, resolve=True), commit)


def hardware_record(trainer, datamodule) -> dict:
    """Where a run trained (a Lightning trainer's accelerator, devices and precision) and its batch sizes."""
    return {
        "accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "global_batch_size": datamodule.batch_size,
        "per_device_batch_size": datamodule.per_device_batch_size(),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "precision": str(trainer.precision),
    }


def migrate(results: dict) -> dict:
    """``results`` as read from any results.json, in the current ``FORMAT``: each step takes one format to the
    next. A file of a later format than this code reads is a ``ValueError``."""
    version = results.get("format", 0)
    if not isinstance(version, int) or not 0 <= version <= FORMAT:
        raise ValueError(
            f"format {version!r}: written by a later version of sve (this one reads formats up to "
            f"{FORMAT}); update sve to read it"
        )
    if version == 0:  # 0 -> 1: files written before the format key
        results = {"format": 1, **results}
        config = results["config"] if isinstance(results.get("config"), dict) else {}
        # Distilled students and runs before the top-level key recorded their experiment in the config only.
        results.setdefault("experiment", config.get("experiment_name"))
        # Runs before num_members recorded the members that produced the predictive as the samples of a sampled
        # method (method_report.num_samples: MC dropout, Bayes-LoRA, BLoB), else as ensemble_size.
        if "num_members" not in results:
            members = (results.get("method_report") or {}).get("num_samples", results.get("ensemble_size"))
            if members is not None:  # none: not the results of a run, which its reader says
                results["num_members"] = members
        # Configs of runs before the move into subpackages name their classes' modules by the old names
        # (sve.MOVED): named by the new ones, they instantiate once the old names are gone.
        if "config" in results:
            results["config"] = moved_targets(results["config"])
    return results


def moved_targets(node):
    """``node`` (a config, nested dicts and lists) with every ``_target_`` in a moved module named by its new
    module (``sve.MOVED``)."""
    if isinstance(node, list):
        return [moved_targets(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: moved_targets(v) for k, v in node.items()}
    target = node.get("_target_")
    if isinstance(target, str) and "." in target and target.rsplit(".", 1)[0] in MOVED:
        module, name = target.rsplit(".", 1)
        node["_target_"] = f"{MOVED[module]}.{name}"
    return node


def read_results(path: Path) -> dict:
    """A run's ``results.json`` in the current format (``migrate``); ``UnreadableFile`` (an ``InputError``)
    naming the file, what is wrong with it (not valid JSON, at which position; empty; unreadable; a later format)
    and that deleting it (or the run directory) runs that run again. Every reader of a finished run's results
    goes through here."""
    results = read_json(path, rerun_hint(path))
    try:
        return migrate(results)
    except ValueError as err:
        raise UnreadableFile(f"{path}: {err}", path) from None


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


def format_beside(results: dict, reference: dict | None) -> str:
    """The headline metrics of a run beside those of a reference run of the same command (the committed
    numbers a quick-start target reproduces), with the settings that decide them; "–" where the reference has
    no such run."""
    rows = [(name, _headline(results), _headline(reference) if reference else {}) for name in _HEADLINE]
    rows = [(name, mine[name], theirs.get(name, "–")) for name, mine, theirs in rows]
    rows.insert(0, ("", "this run", "reference"))
    width = max(len(name) for name, _, _ in rows)
    column = max(len(str(mine)) for _, mine, _ in rows)
    return "\n".join(f"{name:<{width}}  {mine:>{column}}  {theirs:>9}" for name, mine, theirs in rows)


_HEADLINE = ("method", "ensemble_size", "train examples", "acc (%)", "ece (%)", "nll", "wall time (s)")


def _headline(results: dict) -> dict[str, str]:
    m = results["metrics"]
    return {
        "method": str(results["method"]),
        "ensemble_size": str(results["ensemble_size"]),
        "train examples": str((results.get("config") or {}).get("dataset", {}).get("train_size", "all")),
        "acc (%)": f"{100 * m['test/acc']:.2f}",
        "ece (%)": f"{100 * m['test/ece']:.2f}",
        "nll": f"{m['test/nll']:.4f}",
        "wall time (s)": f"{results['wall_time_s']:.1f}",
    }
