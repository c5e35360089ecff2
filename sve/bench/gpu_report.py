"""How ``sve-bench --gpu-check`` judges and writes what it measured: the tolerances per dtype, the error
measure, one ``Check`` per fact checked, and ``results/bench/gpu.md`` / ``gpu.json``.

Nothing here needs a GPU, so the judging and the report are tested on the CPU (tests/bench/test_gpu_check.py) with
hand-made outcomes; the numbers of a real report come only from ``make gpu-check`` on a CUDA machine.

Error measure: ``relative_error(a, b) = max |a - b| / max |b|`` in float64, the worst element against the
reference's scale (an element-wise relative error blows up at values near zero, which every logit vector and
layer output has). Tolerances by the dtype the compared computation runs in, with u its unit roundoff
(float32 6e-8 with TF32 off, which the check sets; bfloat16 3.9e-3; float16 4.9e-4):

- *layer* (one member layer against its merged ``nn.Linear``/convolution): inputs, weights and output are
  rounded to the dtype and products are accumulated in float32, so a few u: 1e-5, 2e-2, 3e-3;
- *model* (logits after every block of a transformer, where rounding passes through attention, softmax and
  layer norms): about three times the layer's: 1e-4, 6e-2, 1e-2.

Multi-process runs use the CPU tests' criteria (tests/training/test_ddp.py, tests/training/test_fsdp.py), run in float32
(``precision=32-true``) with TF32 off, as those tests run: ``DISTRIBUTED_CRITERIA``.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

LAYER_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 3e-3}
MODEL_TOLERANCE = {"float32": 1e-4, "bfloat16": 6e-2, "float16": 1e-2}
# (rtol, atol) of np.testing.assert_allclose on member logits, as in tests/training/test_ddp.py and
# tests/training/test_fsdp.py (the Laplace posteriors: curvature sums in another order, 5e-5 there).
DISTRIBUTED_CRITERIA = {"ddp": (1e-4, 1e-5), "ddp_laplace": (1e-4, 5e-5), "fsdp": (1e-5, 1e-5)}
MIB, GIB = 2**20, 2**30


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """max |actual - reference| / max |reference|, in float64 on the CPU; inf for a shape mismatch or a
    non-finite value (never a pass)."""
    a, b = actual.detach().double().cpu(), reference.detach().double().cpu()
    if a.shape != b.shape or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / max(scale, torch.finfo(torch.float64).tiny) if a.numel() else 0.0


def within(error: float, dtype: torch.dtype | str, kind: str = "layer") -> bool:
    """Whether ``error`` (``relative_error``) is within the ``kind`` (layer or model) tolerance of ``dtype``."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return error <= (LAYER_TOLERANCE if kind == "layer" else MODEL_TOLERANCE)[name]


@dataclass
class Check:
    """One fact checked. ``passed``: True, False, or None when it could not apply here (``detail`` says why)."""

    part: str
    name: str
    passed: bool | None
    detail: str = ""
    values: dict = field(default_factory=dict)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.passed is False]


def error_check(part: str, name: str, errors: dict[str, float], dtype: torch.dtype | str, kind: str) -> Check:
    """A check that every error in ``errors`` (label -> relative error) is within the tolerance."""
    name_of = dtype if isinstance(dtype, str) else dtype_name(dtype)
    limit = (LAYER_TOLERANCE if kind == "layer" else MODEL_TOLERANCE)[name_of]
    worst = max(errors, key=errors.get) if errors else None
    passed = all(within(e, name_of, kind) for e in errors.values())
    detail = f"worst {worst}: {errors[worst]:.2e} (tolerance {limit:.0e}, {name_of}, {kind})" if worst else "nothing"
    return Check(part, name, passed, detail, {"errors": errors, "tolerance": limit, "dtype": name_of})


# ----- the header ------------------------------------------------------------------------------------------
def driver_version() -> str:
    """The NVIDIA driver release as nvidia-smi reports it; else what torch knows (the CUDA driver API version)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    version = getattr(torch._C, "_cuda_getDriverVersion", lambda: None)()
    return f"unknown (CUDA driver API {version // 1000}.{version % 1000 // 10})" if version else "unknown"


def device_header() -> dict:
    """Device names, driver, torch, CUDA and cuDNN versions, the command and the commit."""
    from sve.runs.results import command_line, git_commit, package_versions

    count = torch.cuda.device_count()
    return {
        "devices": [torch.cuda.get_device_name(i) for i in range(count)],
        "memory_gib": [round(torch.cuda.get_device_properties(i).total_memory / GIB, 2) for i in range(count)],
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "command": command_line(),
        "git_commit": git_commit(),
        "versions": package_versions(),
    }


# ----- the report ------------------------------------------------------------------------------------------
def fmt(value, spec: str = ".2f") -> str:
    if value is None:
        return "–"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> list[str]:
    """Rows as a markdown table; ``columns``: (key, header, format spec); a missing value prints as –."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(k), spec) for k, _, spec in columns) + " |" for r in rows]
    return lines + [""]


LATENCY_COLUMNS = [
    ("candidate", "candidate", ""),
    ("precision", "precision", ""),
    ("batch", "batch", "d"),
    ("ms", "median ms", ".2f"),
    ("ratio_to_single", "x Single", ".2f"),
    ("ratio_to_lora_ensemble", "x LoRA-Ensemble", ".2f"),
    ("peak_mib", "peak MiB", ".0f"),
]
PLAN_COLUMNS = [
    ("variant", "run", ""),
    ("layers", "layers", "d"),
    ("phase", "phase", ""),
    ("planned_gib", "planned GiB", ".2f"),
    ("measured_gib", "measured GiB", ".2f"),
    ("error_pct", "plan error %", "+.1f"),
    ("reserved_gib", "reserved GiB", ".2f"),
]


def outcome_markdown(outcome: dict) -> str:
    h = outcome["header"]
    checks = [c if isinstance(c, Check) else Check(**c) for c in outcome["checks"]]
    bad, skipped = failed(checks), [c for c in checks if c.passed is None]
    devices = ", ".join(f"{n} ({m} GiB)" for n, m in zip(h["devices"], h["memory_gib"]))
    lines = [
        "# GPU check (`make gpu-check`)",
        "",
        f"`{h['command']}` at commit {h['git_commit']}: {len(h['devices'])} GPU(s): {devices}; driver "
        f"{h['driver']}, torch {h['torch']}, CUDA {h['cuda']}, cuDNN {h['cudnn']}. Every figure below is from "
        "this device.",
        "",
        f"**{len(checks) - len(bad) - len(skipped)} of {len(checks)} checks passed, {len(bad)} failed, "
        f"{len(skipped)} did not apply.**",
        "",
        "## Checks",
        "",
        "| part | check | outcome | detail |",
        "|---|---|---|---|",
    ]
    word = {True: "pass", False: "**FAIL**", None: "not applicable"}
    cell = lambda text: text.replace("|", "/")  # noqa: E731 - a | would end the cell
    lines += [f"| {c.part} | {cell(c.name)} | {word[c.passed]} | {cell(c.detail)} |" for c in checks]
    lines.append("")
    tables = outcome.get("tables", {})
    if tables.get("latency"):
        lines += [
            "## Inference on BERT-base-shaped layers (Table 5 on a GPU)",
            "",
            tables.get("latency_note", ""),
            "",
        ] + markdown_table(tables["latency"], LATENCY_COLUMNS)
    if tables.get("plan"):
        lines += ["## The memory plan against measured peaks", "", tables.get("plan_note", ""), ""]
        lines += markdown_table(tables["plan"], PLAN_COLUMNS)
    return "\n".join(lines)


def write_report(out: Path, outcome: dict) -> tuple[Path, Path]:
    """``out/gpu.json`` (everything) and ``out/gpu.md`` (the tables); returns their paths."""
    from sve.runs.results import write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {**outcome, "checks": [asdict(c) if isinstance(c, Check) else c for c in outcome["checks"]]}
    # A failed comparison records inf (never a pass), which JSON cannot hold: written as a string.
    write_json(out / "gpu.json", json.loads(json.dumps(data, default=str), parse_constant=str))
    (out / "gpu.md").write_text(outcome_markdown(outcome) + "\n")
    return out / "gpu.json", out / "gpu.md"


__all__ = [
    "LAYER_TOLERANCE",
    "MODEL_TOLERANCE",
    "DISTRIBUTED_CRITERIA",
    "Check",
    "relative_error",
    "within",
    "error_check",
    "failed",
    "device_header",
    "write_report",
    "outcome_markdown",
    "markdown_table",
]
