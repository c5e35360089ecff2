"""The table builder on fixture result files: exact Markdown, LaTeX and CSV (mean ± std, marks, gaps)."""

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sve.paper import render
from sve.paper.build import build, build_all
from sve.paper.display import METHOD_NAMES
from sve.paper.report import metric_table
from sve.paper.store import load_runs, load_spec, run_dir, table_names
from tests.conftest import ROOT as REPO
from tests.conftest import SHARED


def write_run(root: Path, experiment: str, method: str, members: int, seed: int, metrics: dict, **extra) -> Path:
    """A results.json as sve.runs.run writes it (only the keys the builder reads), in the stable run directory."""
    path = run_dir(root, experiment, method, members, seed) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "method": method,
        "ensemble_size": members,
        "seed": seed,
        "metrics": {f"test/{k}": v for k, v in metrics.items()},
        "config": {"experiment_name": experiment},
        **extra,
    }
    path.write_text(json.dumps(results))
    return path


SPEC = OmegaConf.create(
    {
        "name": "golden",
        "kind": "metrics",
        "title": "Golden",
        "metrics": ["acc", "ece", "nll"],
        "seeds": [0, 1, 2],
        "experiments": {"exp_a": "Experiment A"},
        "rows": [
            {"method": "single", "members": 1},
            {"method": "lora_ensemble", "members": 4},
            {"method": "sve", "members": 4},
            {"method": "deep_ensemble", "members": 4},
        ],
    }
)


@pytest.fixture
def golden_root(tmp_path):
    root = tmp_path / "results"
    for seed, (acc, ece, nll) in enumerate([(0.80, 0.05, 0.50), (0.82, 0.07, 0.52), (0.84, 0.06, 0.54)]):
        write_run(root, "exp_a", "single", 1, seed, {"acc": acc, "ece": ece, "nll": nll})
        # ties single's accuracy (82.0): both are underlined as second best
        write_run(root, "exp_a", "lora_ensemble", 4, seed, {"acc": 0.82, "ece": 0.10, "nll": 0.60})
    for seed, (acc, ece, nll) in enumerate([(0.90, 0.02, 0.30), (0.92, 0.04, 0.34)]):  # seed 2 missing
        write_run(root, "exp_a", "sve", 4, seed, {"acc": acc, "ece": ece, "nll": nll})
    # not part of the table: another experiment, and a smoke run that a full build must not see
    write_run(root, "exp_b", "sve", 4, 0, {"acc": 0.1, "ece": 0.1, "nll": 1.0})
    write_run(root / "smoke", "exp_a", "deep_ensemble", 4, 0, {"acc": 0.99, "ece": 0.0, "nll": 0.0})
    return root


GOLDEN_MD = """\
## Golden

| Method | M | Acc (%) ↑ | ECE (%) ↓ | NLL ↓ |
|:--|--:|--:|--:|--:|
| *Experiment A* | | | | |
| Single | 1 | <u>82.0 ± 2.0</u> | <u>6.0 ± 1.0</u> | <u>0.52 ± 0.02</u> |
| LoRA-Ensemble | 4 | <u>82.0 ± 0.0</u> | 10.0 ± 0.0 | 0.60 ± 0.00 |
| SV-Ensemble | 4 | **91.0 ± 1.4†** | **3.0 ± 1.4†** | **0.32 ± 0.03†** |
| Deep Ensemble | 4 | – | – | – |

Mean ± sample standard deviation over seeds 0, 1, 2 (one seed: no ±); † fewer seeds than that.
Bold: best of our runs in each block; underlined: second best (↑ higher is better, ↓ lower).

Missing runs (–):
- exp_a · SV-Ensemble (M=4): seed 2 ({root}/runs/exp_a/sve_m4)
- exp_a · Deep Ensemble (M=4): seeds 0, 1, 2 ({root}/runs/exp_a/deep_ensemble_m4)
"""


def test_golden_markdown(golden_root):
    table = metric_table(SPEC, load_runs(golden_root), golden_root, with_paper=False)
    assert render.to_markdown(table) == GOLDEN_MD.format(root=golden_root)


def test_golden_latex(golden_root):
    tex = render.to_latex(metric_table(SPEC, load_runs(golden_root), golden_root, with_paper=False))
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    assert body == [
        r"\multicolumn{5}{l}{\textit{Experiment A}} \\",
        r"Single & 1 & \underline{82.0 $\pm$ 2.0} & \underline{6.0 $\pm$ 1.0} & \underline{0.52 $\pm$ 0.02} \\",
        r"LoRA-Ensemble & 4 & \underline{82.0 $\pm$ 0.0} & 10.0 $\pm$ 0.0 & 0.60 $\pm$ 0.00 \\",
        r"SV-Ensemble & 4 & \textbf{91.0 $\pm$ 1.4$^\dagger$} & \textbf{3.0 $\pm$ 1.4$^\dagger$} & "
        r"\textbf{0.32 $\pm$ 0.03$^\dagger$} \\",
        r"Deep Ensemble & 4 & -- & -- & -- \\",
    ]
    assert r"Acc (\%) $\uparrow$ & ECE (\%) $\downarrow$" in tex


def test_golden_csv_holds_unrounded_display_units(golden_root):
    lines = render.to_csv(metric_table(SPEC, load_runs(golden_root), golden_root, with_paper=False)).splitlines()
    assert lines[0] == "experiment,method,members,seeds,acc,acc_std,ece,ece_std,nll,nll_std"
    single = dict(zip(lines[0].split(","), lines[1].split(",")))
    assert float(single["acc"]) == pytest.approx(82.0) and float(single["acc_std"]) == pytest.approx(2.0)
    assert single["seeds"] == "3" and float(single["nll"]) == pytest.approx(0.52)
    assert lines[3].startswith("exp_a,sve,4,2,") and lines[4] == "exp_a,deep_ensemble,4,0,,,,,,"


def test_paper_column_sits_beside_ours_and_fills_nothing(golden_root, tmp_path):
    paper = tmp_path / "paper.csv"
    paper.write_text(
        "# a comment line\nexperiment,method,members,acc,acc_std,ece,ece_std,nll,nll_std\n"
        "exp_a,deep_ensemble,4,85.4,0.1,3.9,0.1,0.50,0.00\nexp_a,sve,,95.0,,1.0,,0.2,\n"
    )
    spec = OmegaConf.merge(SPEC, {"paper": str(paper)})
    md = render.to_markdown(metric_table(spec, load_runs(golden_root), golden_root))
    assert "| Method | M | Acc (%) ↑ | paper | ECE (%) ↓ | paper | NLL ↓ | paper |" in md
    assert "| Deep Ensemble | 4 | – | 85.4 ± 0.1 | – | 3.9 ± 0.1 | – | 0.50 ± 0.00 |" in md  # ours stays "–"
    assert "| **91.0 ± 1.4†** | 95.0 | **3.0 ± 1.4†** | 1.0 |" in md  # blank members: any count; no ± printed
    assert f'"paper": the paper\'s numbers ({paper}), for comparison only.' in md


def test_one_seed_has_no_std_and_lower_is_better_marks(tmp_path):
    root = tmp_path / "r"
    write_run(root, "exp_a", "single", 1, 0, {"acc": 0.5, "ece": 0.30, "nll": 2.0})
    write_run(root, "exp_a", "sve", 4, 0, {"acc": 0.4, "ece": 0.10, "nll": 1.0})
    spec = OmegaConf.merge(SPEC, {"seeds": [0]})
    md = render.to_markdown(metric_table(spec, load_runs(root), root, with_paper=False))
    assert "| Single | 1 | **50.0** | <u>30.0</u> | <u>2.00</u> |" in md
    assert "| SV-Ensemble | 4 | <u>40.0</u> | **10.0** | **1.00** |" in md


def test_a_row_tuned_to_an_edge_of_its_grid_is_marked_and_named_under_the_table(tmp_path):
    root = tmp_path / "r"
    write_run(root, "exp_a", "single", 1, 0, {"acc": 0.5, "ece": 0.30, "nll": 2.0})
    write_run(root, "exp_a", "sve", 4, 0, {"acc": 0.4, "ece": 0.10, "nll": 1.0})
    tuned = {"key": "method.lr", "value": "0.03", "grid": ["0.001", "0.003", "0.01", "0.03"], "edge": None}
    (run_dir(root, "exp_a", "single", 1, 0).parent / "tuned.json").write_text(json.dumps(tuned))
    (run_dir(root, "exp_a", "sve", 4, 0).parent / "tuned.json").write_text(json.dumps({**tuned, "edge": "upper"}))
    spec = OmegaConf.merge(SPEC, {"seeds": [0]})
    md = render.to_markdown(metric_table(spec, load_runs(root), root, with_paper=False))
    assert "| SV-Ensemble‡ | 4 |" in md and "| Single | 1 |" in md  # an interior choice is not marked
    assert (
        "‡ exp_a · SV-Ensemble (M=4): method.lr chosen on the upper edge of its searched grid, which could not "
        "grow further (tuned.json): not an interior optimum"
    ) in md
    assert "SV-Ensemble‡" in render.to_latex(metric_table(spec, load_runs(root), root, with_paper=False))


def test_extra_columns_beside_the_papers_and_no_marks_without_a_direction(tmp_path):
    root = tmp_path / "r"
    write_run(root, "exp_a", "single", 1, 0, {"acc": 0.5, "ts_ece": 0.04, "mutual_information": 0.0})
    write_run(root, "exp_a", "sve", 4, 0, {"acc": 0.4, "ts_ece": 0.02, "mutual_information": 0.1234})
    spec = OmegaConf.merge(SPEC, {"seeds": [0], "metrics": ["acc", "ts_ece", "mutual_information"]})
    md = render.to_markdown(metric_table(spec, load_runs(root), root, with_paper=False))
    assert "| Method | M | Acc (%) ↑ | TS ECE (%) ↓ | MI (nats) |" in md
    assert "| Single | 1 | **50.0** | <u>4.0</u> | 0.000 |" in md  # MI describes, it is not ranked
    assert "| SV-Ensemble | 4 | <u>40.0</u> | **2.0** | 0.123 |" in md


def test_aurc_is_a_column_a_definition_may_name_and_older_runs_without_it_show_a_dash(tmp_path):
    root = tmp_path / "r"
    write_run(root, "exp_a", "single", 1, 0, {"acc": 0.5})  # results.json from before test/aurc
    write_run(root, "exp_a", "sve", 4, 0, {"acc": 0.4, "aurc": 0.0512})
    spec = OmegaConf.merge(SPEC, {"seeds": [0], "metrics": ["acc", "aurc"]})
    md = render.to_markdown(metric_table(spec, load_runs(root), root, with_paper=False))
    assert "| Method | M | Acc (%) ↑ | AURC (%) ↓ |" in md
    assert "| Single | 1 | **50.0** | – |" in md
    assert "| SV-Ensemble | 4 | <u>40.0</u> | **5.12** |" in md


def test_a_top_level_experiment_key_wins_over_the_config(tmp_path):
    path = write_run(tmp_path, "from_config", "sve", 4, 0, {"acc": 0.5})
    path.write_text(json.dumps({**json.loads(path.read_text()), "experiment": "top_level"}))
    (run,) = load_runs(tmp_path)
    assert run.experiment == "top_level"


def test_every_definition_builds_on_empty_results(tmp_path):
    """make tables on an empty results/: every table is written, every cell of ours is "–"."""
    written = build_all(root=tmp_path) + build_all(root=tmp_path / "mini")  # the paper's, the miniature's
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    for name in table_names():
        where = "mini/tables" if name.startswith("mini_") else "tables"  # never both
        if load_spec(name).kind in ("metrics", "cost", "figure2", "figure3"):
            assert {f"{where}/{name}.md", f"{where}/{name}.csv"} <= names, name
        assert f"tables/{name}.md" not in names or where == "tables", name
    table1 = (tmp_path / "tables" / "table1.md").read_text()
    assert "| Single | 1 | – | 86.3 ± 0.8 |" in table1 and "Missing runs (–):" in table1
    assert not (tmp_path / "figures").exists()  # no data, no figure


def test_table5_from_a_benchmark_file(tmp_path):
    bench = {
        "setting": {"backbone": "bert_base"},
        "methods": {
            "single": {
                "parameters": 100,
                "train_memory_bytes": 1000,
                "infer_memory_bytes": 500,
                "infer_gflops": 21.9,
                "infer_ms": 3.0,
            },
            "sve": {
                "parameters": 101,
                "trainable_parameters": 1,
                "train_memory_bytes": 1100,
                "infer_memory_bytes": 510,
                "infer_gflops": 175.2,
                "infer_ms": 20.0,
            },
            "deep_ensemble": {
                "parameters": 800,
                "train_memory_bytes": 8000,
                "infer_memory_bytes": 4000,
                "infer_gflops": 175.2,
                "infer_ms": 24.0,
            },
        },
    }
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "table5.json").write_text(json.dumps(bench))
    build("table5", root=tmp_path)
    md = (tmp_path / "tables" / "table5.md").read_text()
    # overheads relative to single; trainable parameters as a share of single's parameters (a file without
    # them: "–"), beside the paper's one parameter column; the paper has no stored-parameter or
    # inference-memory column (blank)
    assert (
        "| SV-Ensemble | 8 | **1.0** | 1.0 | **1.0** |  | **10.0** | 1.0 | **2.0** |  | **175.2** | 175.2 | "
        "**20.0** | 21.9 |" in md
    )
    assert (
        "| Deep Ensemble | 8 | – | 700.0 | <u>700.0</u> |  | <u>700.0</u> | 700.0 | <u>700.0</u> |  | **175.2** |" in md
    )
    assert "- Single w/ SVF (M=1): not in" in md


# --- the paper's numbers --------------------------------------------------------------------------------


def test_paper_rows_are_cells_of_their_tables():
    """Every transcribed row has a row in the table that prints it (else its paper cell would never show)."""
    for name in table_names():
        spec = load_spec(name)
        if not spec.get("paper") or spec.get("paper_as"):  # a miniature shows only the rows it has
            continue
        paper = [
            line.split(",")[:3]
            for line in (REPO / "sve" / "configs" / spec.paper).read_text().splitlines()[1:]
            if not line.startswith("#")
        ]
        cells = {(e, r.method, str(r.members)) for e in spec.experiments for r in spec.rows}
        for experiment, method, members in paper[1:]:
            assert any(c[:2] == (experiment, method) and members in ("", c[2]) for c in cells), (name, method)


def test_a_miniature_shows_the_papers_row_of_each_method_beside_its_own():
    # mini Table 3 stands for the paper's ARC-Easy runs: SVE at M = 2 takes Table 6's M = 2 row (exact
    # match first, the first listed file winning), SVF its only row, whatever the member count.
    spec = load_spec("mini_table3")
    table = metric_table(spec, [], REPO / "results" / "mini")
    rows = {(r.method, r.members): r for r in table.blocks[0].rows}
    assert rows[("sve", 2)].paper["acc"].mean == 84.5  # sve/configs/paper/table6.csv
    assert rows[("svf", 1)].paper and "table6.csv" in table.paper_source and "table3.csv" in table.paper_source
    assert all(not cell for r in rows.values() for cell in r.cells.values())  # no runs: ours stay empty


@pytest.mark.parametrize("name", ["table1", "table2", "table3", "table4", "table6"])
def test_paper_numbers_are_rows_of_the_paper_text(name):
    """Each transcribed row appears, tab-separated and in the printed format, as a row of the paper's text."""
    text_path = SHARED / "paper" / "singular-value-ensembles.txt"
    if not text_path.exists():
        pytest.skip(f"needs the paper's text at {text_path}")
    lines = text_path.read_text().splitlines()
    rows = [
        line
        for line in (REPO / "sve" / "configs" / "paper" / f"{name}.csv").read_text().splitlines()
        if not line.startswith("#")
    ]
    header = rows[0].split(",")
    for row in rows[1:]:
        record = dict(zip(header, row.split(",")))
        metrics = [k for k in header[3:] if not k.endswith("_std")]
        printed = "\t".join(
            record[k] + (f"$\\pm${record[k + '_std']}" if f"{k}_std" in record else "") for k in metrics
        )
        label = record["members"] if name == "table6" else METHOD_NAMES[record["method"]].split(" (")[0]
        assert any(line.startswith(label) and line.endswith("\t" + printed) for line in lines), row
    assert re.search(r"\d", printed)
