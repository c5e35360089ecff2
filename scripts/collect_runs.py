"""Copies the finished runs of one result store into another, for committing: ``python scripts/collect_runs.py
SOURCE TARGET`` (e.g. a clean clone's ``results/mini`` into this checkout's).

The miniature trains in a clean clone at a committed commit, so that its runs name code that exists; this
brings what finished back, from runs/ and diagnostics/. A run is finished when its directory holds
``results.json``. Copied: what the repository keeps of a run (results.json, run_config.yaml, train.log,
predictive/, an adapter/ whose files are at most 1 MiB each and 8 MiB together), each row's tuned.json, the
lines of ``sittings.jsonl`` of the runs
copied (the store's wall time), and of each teacher that ``scripts/mini_distill.py`` trained again its
results.json and reproduced.json.
Left behind: checkpoints, CSV logs, predictions, larger adapters and tuning runs' adapters, Hydra's folder,
locks and failure records of earlier attempts, and everything of a run still training. A run already in
TARGET is replaced only when SOURCE's results.json differs (``--dry-run`` lists what would change).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from sve.errors import InputError, one_line_errors
from sve.paper.sittings import SITTINGS
from sve.paper.store import DIAGNOSTICS, TEACHERS, TUNED

SKIPPED = {"checkpoints", "csv", "predictions", ".hydra", ".lock", "failed.json", "singular_values.npz"}
# A run's adapter/ is kept when small (SVE's singular values and heads: well under 1 MB): with it a committed
# run is evaluated again, or distilled, on any machine (sve-eval run_dir=<run>/adapter). A full fine-tune's is
# the whole model again (100+ MB): left behind.
MAX_ADAPTER_FILE_BYTES = (
    2**20
)  # the repository takes no file over 1 MiB (a run may shard its adapter: adapter.shard_mb)
MAX_ADAPTER_BYTES = 8 * 2**20  # SVE at M = 4 on SmolLM2-135M: about 4 MB; a LoRA-Ensemble's (39 MB) stays behind
REPRODUCED = "reproduced.json"  # beside scripts/mini_distill.py's retrained teachers (TEACHERS)


def size_of(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def too_large(adapter: Path) -> bool:
    """An adapter the repository does not take: a file over 1 MiB, or over 8 MiB in all."""
    files = [f for f in adapter.rglob("*") if f.is_file()]
    return any(f.stat().st_size > MAX_ADAPTER_FILE_BYTES for f in files) or size_of(adapter) > MAX_ADAPTER_BYTES


def finished_runs(store: Path) -> list[Path]:
    """The table runs (runs/) and the diagnostics (diagnostics/, make mini-diagnostics) that have finished."""
    return sorted(p.parent for part in ("runs", DIAGNOSTICS) for p in (store / part).rglob("results.json"))


def copy_run(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.name in SKIPPED or (item.name == "predictive" and "tune" in source.parts):
            continue  # tuning runs' per-example statistics: the chosen run is a seed run as well
        if item.name == "adapter" and (too_large(item) or "tune" in source.parts):
            continue
        if item.is_dir():
            shutil.copytree(item, target / item.name)
        else:
            shutil.copy2(item, target / item.name)


def collect(source: Path, target: Path, dry_run: bool = False) -> list[str]:
    """What changed in ``target``, one line each."""
    if not (source / "runs").is_dir():
        raise InputError(f"{source / 'runs'} does not exist: SOURCE must be a result store (e.g. results/mini)")
    changes = []
    copied = set()
    for run in finished_runs(source):
        relative = run.relative_to(source)
        there = target / relative
        if (there / "results.json").exists() and (there / "results.json").read_bytes() == (
            run / "results.json"
        ).read_bytes():
            continue
        changes.append(f"{'replaced' if there.exists() else 'added'} {relative}")
        copied.add(str(relative))
        if not dry_run:
            copy_run(run, there)
    for tuned in sorted((source / "runs").rglob(TUNED)):
        there = target / tuned.relative_to(source)
        if not there.exists() or there.read_bytes() != tuned.read_bytes():
            changes.append(f"tuned {tuned.parent.relative_to(source)}")
            if not dry_run:
                there.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tuned, there)
    # Teachers that mini_distill.py trained again (teachers/): their results and reproduction record, which
    # the README reads for the singular values' movement of runs that predate it; not their checkpoints.
    for record in sorted((source / TEACHERS).rglob(REPRODUCED)) if (source / TEACHERS).is_dir() else []:
        for name in (REPRODUCED, "results.json"):
            found, there = record.parent / name, target / record.parent.relative_to(source) / name
            if found.is_file() and (not there.exists() or there.read_bytes() != found.read_bytes()):
                changes.append(f"teacher {there.parent.relative_to(target)}: {name}")
                if not dry_run:
                    there.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(found, there)
    lines = (source / SITTINGS).read_text().splitlines() if (source / SITTINGS).exists() else []
    known = set((target / SITTINGS).read_text().splitlines()) if (target / SITTINGS).exists() else set()
    new = [line for line in lines if line and line not in known and json.loads(line)["run"] in copied]
    if new:
        changes.append(f"{len(new)} line(s) of {SITTINGS}")
        if not dry_run:
            with (target / SITTINGS).open("a") as f:
                f.write("".join(line + "\n" for line in new))
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the store the runs were trained in")
    parser.add_argument("target", type=Path, help="the store to copy them into")
    parser.add_argument("--dry-run", action="store_true", help="list what would change, copy nothing")
    args = parser.parse_args(argv)
    changes = collect(args.source, args.target, args.dry_run)
    print("\n".join(changes) if changes else "nothing new")
    return 0


if __name__ == "__main__":
    with one_line_errors():
        raise SystemExit(main())
