"""Prints the Markdown table that compares diagnostic runs with the table cell they vary:
``python scripts/diagnostics_table.py RUN_DIR [RUN_DIR ...]``, each a directory holding a ``results.json``
(a table run's ``.../seed0`` or a diagnostic's). ``results/mini/diagnostics/README.md`` quotes its output, so
the numbers there are read from the runs, not typed in.

Columns: the test metrics (accuracy, ECE, NLL in the table's units), each member's test accuracy, the
validation NLL that tuning selects on, the setting that differs (learning rate, sigma_init, epochs) and, for
SVE-family runs, the members' spread as a multiple of its initial value sigma_init sqrt((M-1)/M) and the shift
of their mean (``sve.paper.movement``), then the run's wall time. With ``--against RUN_DIR`` a second table gives
each run's difference from that one with a paired-bootstrap 95% interval over the test examples
(``sve.paper.bootstrap``: one resample shared by both runs, 2,000 replicates, numpy seed 0). With one seed a
run, the interval holds the test set's noise only, not the training's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sve.errors import InputError, one_line_errors
from sve.paper.bootstrap import Term, check_paired, interval, statistic
from sve.paper.movement import initial_spread, sigma_of
from sve.runs.prediction_files import read_predictive
from sve.runs.results import read_results

HEADER = (
    "| Run | lr | sigma_init | epochs | Acc (%) | ECE (%) | NLL | members' acc (%) | val NLL "
    "| spread / initial | mean shift (%) | wall time |"
)


def row(run_dir: Path, root: Path) -> str:
    results = read_results(run_dir / "results.json")
    metrics, config = results["metrics"], results.get("config") or {}
    members = results.get("num_members", 1)
    sigma = sigma_of(results)
    record = (results.get("method_report") or {}).get("singular_values")
    if record and sigma and members > 1:
        spread = f"{record['member_spread'] / initial_spread(sigma, members):.2f}"
        shift = f"{100 * record['mean_shift']:.2f}"
    else:
        spread = shift = "–"
    member_acc = ", ".join(f"{100 * a:.1f}" for a in metrics.get("test/member_acc") or [])
    lr = (config.get("method") or {}).get("lr")
    cells = [
        f"`{run_dir.relative_to(root) if run_dir.is_relative_to(root) else run_dir}`",
        f"{lr:g}" if isinstance(lr, (int, float)) else "–",
        f"{sigma:g}" if sigma is not None else "–",
        str((config.get("trainer") or {}).get("max_epochs", "–")),
        f"{100 * metrics['test/acc']:.1f}",
        f"{100 * metrics['test/ece']:.1f}",
        f"{metrics['test/nll']:.3f}",
        member_acc,
        f"{metrics['val/nll']:.3f}" if "val/nll" in metrics else "–",
        spread,
        shift,
        f"{results['wall_time_s'] / 60:.0f} min" if "wall_time_s" in results else "–",
    ]
    return "| " + " | ".join(cells) + " |"


def table(run_dirs: list[Path], root: Path) -> str:
    missing = [str(d) for d in run_dirs if not (d / "results.json").is_file()]
    if missing:
        raise InputError(f"no results.json in {', '.join(missing)}: give finished runs' directories")
    lines = [HEADER, "|:--|" + "--:|" * (HEADER.count("|") - 2)]
    return "\n".join(lines + [row(d, root) for d in run_dirs])


DIFFERENCES = (("acc", "Acc (points)", 100), ("ece", "ECE (points)", 100), ("nll", "NLL", 1))


def test_examples(run_dir: Path):
    examples = read_predictive(run_dir / "predictive" / "test.npz", "test")
    if examples is None:
        raise InputError(f"{run_dir} has no predictive/test.npz: its per-example statistics are needed for an interval")
    return examples


def differences(run_dirs: list[Path], against: Path, root: Path) -> str:
    """Each run minus ``against`` on the test set, with its paired interval."""
    reference = test_examples(against)
    lines = ["| Run | " + " | ".join(label for _, label, _ in DIFFERENCES) + " |", "|:--|" + ":--|" * len(DIFFERENCES)]
    for run_dir in run_dirs:
        if run_dir == against:
            continue
        examples, cells = test_examples(run_dir), []
        for key, _, scale in DIFFERENCES:
            a, b = statistic(key, [examples]), statistic(key, [reference])
            check_paired(a, b)
            found = interval([Term(1.0, 0, a), Term(-1.0, 0, b)])
            digits = 1 if scale == 100 else 3
            cells.append(
                f"{scale * found.point:+.{digits}f} [{scale * found.low:+.{digits}f}, {scale * found.high:+.{digits}f}]"
            )
        name = run_dir.relative_to(root) if run_dir.is_relative_to(root) else run_dir
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, each with a results.json")
    parser.add_argument("--root", type=Path, default=Path("results/mini"), help="run names are shown relative to it")
    parser.add_argument("--against", type=Path, help="a run directory: each run's difference from it, with intervals")
    args = parser.parse_args(argv)
    runs, root = [d.resolve() for d in args.runs], args.root.resolve()
    with one_line_errors():
        print(table(runs, root))
        if args.against is not None:
            print(f"\nDifference from `{args.against}` [95% interval over the test examples]:\n")
            print(differences(runs, args.against.resolve(), root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
