"""How much training the single model needs in the mini SST-2 setting: ``make mini-budget``.

Trains the Single baseline (its own learning rate, 1e-4, Appendix C.3) of ``experiment=mini_sst2_minilm``
on several training-set sizes for ``--epochs`` epochs and reads its *validation* accuracy and NLL after
every epoch from the run's CSV log (the test set is never looked at). Writes the runs under
``results/mini/budget/n<size>/`` (finished ones are skipped) and the curve to ``results/mini/budget.md``.
The budget of the mini SST-2 experiment is the smallest whose validation accuracy is within ``--tolerance``
of the best one seen: more training would not change what a reader compares.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from sve.report import REPO
from sve.run import run


def train(size: int, epochs: int, out: Path) -> float:
    """One Single run on ``size`` training sentences; returns its wall time (0 when it had finished)."""
    if (out / "results.json").exists():
        return 0.0
    overrides = ["experiment=mini_sst2_minilm", "experiment_name=mini_sst2_budget",  # not a cell of mini Table 2
                 "method=single", "ensemble_size=1", "trainer=cpu",
                 f"dataset.train_size={size}", f"trainer.max_epochs={epochs}", "callbacks=default",
                 "trainer.limit_val_batches=1.0",  # the mini experiments skip validation during training
                 f"paths.output_dir={out}", "seed=0"]  # fmt: skip
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    start = time.perf_counter()
    run(cfg)
    return time.perf_counter() - start


def curve(out: Path, epochs: int) -> list[dict]:
    """Validation accuracy and NLL after each epoch, from the run's CSV log. The evaluation after training
    logs the final model's validation metrics again, without an epoch or as one epoch more: left out."""
    rows = list(csv.DictReader((out / "csv" / "version_0" / "metrics.csv").open()))
    by_epoch = {}
    for row in rows:
        if row.get("val/acc") and row.get("epoch") and int(row["epoch"]) < epochs:
            by_epoch[int(row["epoch"])] = {"epoch": int(row["epoch"]) + 1, "val_acc": float(row["val/acc"]),
                                           "val_nll": float(row["val/nll"])}  # fmt: skip
    return [by_epoch[e] for e in sorted(by_epoch)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.01, help="validation accuracy, as a fraction")
    parser.add_argument("--results", type=Path, default=REPO / "results" / "mini")
    args = parser.parse_args(argv)
    points = []
    for size in args.sizes:
        out = args.results / "budget" / f"n{size}"
        seconds = train(size, args.epochs, out)
        results = json.loads((out / "results.json").read_text())
        for point in curve(out, args.epochs):
            points.append({"train_size": size, **point})
        print(f"n={size}: {results['wall_time_s']:.0f} s" + (" (trained now)" if seconds else " (found)"), flush=True)
    best = max(p["val_acc"] for p in points)
    enough = min((p for p in points if p["val_acc"] >= best - args.tolerance),
                 key=lambda p: p["train_size"] * p["epoch"])  # the fewest sentence-epochs
    lines = ["# Training budget of the mini SST-2 experiment (Single, MiniLM-L6, validation split)", "",
             "| training sentences | epoch | val acc (%) | val NLL |", "|--:|--:|--:|--:|"]  # fmt: skip
    lines += [f"| {p['train_size']} | {p['epoch']} | {100 * p['val_acc']:.1f} | {p['val_nll']:.3f} |" for p in points]
    lines += ["", f"Best validation accuracy {100 * best:.1f}%; the smallest budget within "
              f"{100 * args.tolerance:.0f} point(s) of it: {enough['train_size']} sentences x {enough['epoch']} "
              "epoch(s). Each size is one run of --epochs epochs (cosine schedule over all of them), read after "
              "every epoch; seed 0. Written by scripts/mini_budget.py."]  # fmt: skip
    (args.results / "budget.md").write_text("\n".join(lines) + "\n")
    (args.results / "budget.json").write_text(json.dumps({"points": points, "chosen": enough}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
