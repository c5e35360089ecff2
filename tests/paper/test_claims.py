"""Claim verdicts (sve.paper.claims) and the miniature's README (scripts/mini_report.py) on fixture runs: the
verdicts follow the numbers (flip a number, the verdict flips), the noise flag follows the seeds' spread."""

import json
import sys

import pytest
from omegaconf import OmegaConf

from sve.paper.claims import judge, load_claims
from sve.paper.claims_text import to_markdown
from sve.paper.evidence import cell
from sve.paper.store import load_runs
from tests.conftest import ROOT as REPO
from tests.paper.test_report import write_run

sys.path.insert(0, str(REPO / "scripts"))
import mini_report  # noqa: E402


def runs_with(root, table: dict) -> list:
    """table: {(experiment, method, members): [per-seed metric dicts]}."""
    for (experiment, method, members), seeds in table.items():
        for seed, metrics in enumerate(seeds):
            write_run(root, experiment, method, members, seed, metrics, num_members=members)
    return load_runs(root)


def claims(*checks) -> OmegaConf:
    claim = {"title": "T", "paper": "P", "checks": list(checks)}
    return OmegaConf.create({"settings": {"e": "Exp"}, "claims": [claim]})


def test_cell_is_the_mean_and_spread_over_seeds_in_display_units(tmp_path):
    runs = runs_with(tmp_path, {("e", "sve", 4): [{"ece": 0.02}, {"ece": 0.04}, {"ece": 0.06}]})
    value = cell(runs, "e", "sve:4", "ece")
    assert value.mean == pytest.approx(4.0) and value.std == pytest.approx(2.0) and value.seeds == 3
    assert cell(runs, "e", "single:1", "ece") is None


@pytest.mark.parametrize("sve_ece, held", [(0.02, True), (0.09, False)])
def test_compare_verdict_follows_the_numbers(tmp_path, sve_ece, held):
    runs = runs_with(
        tmp_path,
        {("e", "sve", 4): [{"ece": sve_ece, "acc": 0.80}] * 3, ("e", "single", 1): [{"ece": 0.05, "acc": 0.805}] * 3},
    )
    ((claim, verdicts),) = judge(
        claims({"experiment": "e", "a": "sve:4", "against": ["single:1"], "metrics": ["ece"], "similar": {"acc": 1.0}}),
        runs,
    )
    ece, acc = verdicts
    assert ece.held is held and not ece.noise  # identical seeds: no spread, a clear difference
    # 0.5 points behind, within the 1.0 margin: a difference below 0 is never held, by either procedure
    assert not acc.held and acc.previous.verdict == acc.verdict and acc.kind == "lenient" and acc.margin == 1.0
    assert ece.kind == "strict" and ece.margin is None
    assert ece.ours == f"{100 * sve_ece:.1f} ± 0.0 vs 5.0 ± 0.0"


def test_a_difference_inside_the_seed_spread_is_flagged(tmp_path):
    runs = runs_with(
        tmp_path,
        {
            ("e", "sve", 4): [{"nll": 0.40}, {"nll": 0.50}, {"nll": 0.60}],
            ("e", "single", 1): [{"nll": 0.52}, {"nll": 0.52}, {"nll": 0.52}],
        },
    )
    ((_, verdicts),) = judge(
        claims({"experiment": "e", "a": "sve:4", "against": ["single:1"], "metrics": ["nll"]}), runs
    )
    assert verdicts[0].held and verdicts[0].noise
    ((_, worse),) = judge(
        claims({"experiment": "e", "a": "sve:4", "against": ["single:1"], "metrics": ["nll"], "expect": "worse"}), runs
    )
    assert not worse[0].held


def test_gain_and_trend(tmp_path):
    runs = runs_with(
        tmp_path,
        {
            ("pre", "sve", 4): [{"acc": 0.90}] * 2,
            ("pre", "single", 1): [{"acc": 0.85}] * 2,
            ("rand", "sve", 4): [{"acc": 0.60}] * 2,
            ("rand", "single", 1): [{"acc": 0.62}] * 2,
            ("arc", "sve", 1): [{"nll": 1.2}] * 2,
            ("arc", "sve", 2): [{"nll": 1.1}] * 2,
            ("arc", "sve", 4): [{"nll": 1.15}] * 2,
        },
    )
    ((_, g),) = judge(
        claims(
            {"kind": "gain", "experiments": ["pre", "rand"], "a": "sve:4", "against": ["single:1"], "metrics": ["acc"]}
        ),
        runs,
    )
    assert g[0].held and g[0].ours == "+5.0 vs -2.0"
    ((_, t),) = judge(
        claims({"kind": "trend", "experiment": "arc", "rows": ["sve:1", "sve:2", "sve:4"], "metrics": ["nll"]}), runs
    )
    assert not t[0].held  # M = 4 is worse than M = 2
    assert t[0].ours == "1.20 ± 0.00 → 1.10 ± 0.00 → 1.15 ± 0.00"


def test_shift_metrics_read_the_severity_means(tmp_path):
    for seed, ece in enumerate([0.10, 0.12]):
        write_run(tmp_path, "e", "sve", 4, seed, {}, num_members=4, shift={"by_severity": {"5": {"ece": ece}}})
        write_run(tmp_path, "e", "single", 1, seed, {}, num_members=1, shift={"by_severity": {"5": {"ece": 0.2}}})
    ((_, verdicts),) = judge(
        claims({"experiment": "e", "a": "sve:4", "against": ["single:1"], "metrics": ["sev5/ece"]}), load_runs(tmp_path)
    )
    assert verdicts[0].held and verdicts[0].metric == "ECE (%) ↓, severity 5"


def test_bad_input_names_the_valid_choices(tmp_path):
    with pytest.raises(ValueError, match="choose one of"):
        judge(claims({"experiment": "e", "a": "sve:4", "against": [], "metrics": ["ece"], "expect": "much"}), [])
    with pytest.raises(ValueError, match="unknown metric 'eec'"):
        judge(claims({"experiment": "e", "a": "sve:4", "against": ["single:1"], "metrics": ["eec"]}), [])
    with pytest.raises(ValueError, match="method:members"):
        judge(claims({"experiment": "e", "a": "sve", "against": ["single:1"], "metrics": ["ece"]}), [])
    with pytest.raises(ValueError, match="choose one of"):
        load_claims("nope")


def test_missing_cells_give_no_verdict():
    check = {"experiment": "e", "a": "sve:4", "against": ["single:1"], "metrics": ["ece"]}
    text = to_markdown(judge(claims(check), []))
    assert "No verdict yet" in text


def test_the_mini_claims_file_names_real_rows_and_metrics():
    """Every row and metric of configs/claims/mini.yaml parses, and every experiment is a mini experiment."""
    spec = load_claims("mini")
    experiments = {p.stem for p in (REPO / "configs" / "experiment").glob("mini_*.yaml")}
    assert set(spec.settings) <= experiments
    assert judge(spec, [])  # parses every check (no runs: no verdicts)
    for claim in spec.claims:
        for check in claim.checks:
            for e in check.get("experiments") or [check.experiment]:
                assert e in experiments, e


def test_mini_report_fills_every_placeholder(tmp_path):
    root = tmp_path / "mini"
    write_run(
        root,
        "mini_sst2_minilm",
        "sve",
        4,
        0,
        {"acc": 0.8, "ece": 0.05, "nll": 0.5},
        num_members=4,
        wall_time_s=120.0,
        git_commit="abc123-dirty",
        config={
            "experiment_name": "mini_sst2_minilm",
            "method": {"lr": 0.001},
            "dataset": {"name": "sst2", "train_size": 1000, "batch_size": 16},
            "trainer": {"max_epochs": 2},
            "backbone": {"name": "minilm_l6"},
        },
    )
    tuned = root / "runs" / "mini_sst2_minilm" / "sve_m4" / "tuned.json"
    tuned.write_text(json.dumps({"value": "0.001", "metric": "val/nll", "scores": {"0.0001": 0.6, "0.001": 0.5}}))
    text = mini_report.render(root, (REPO / "configs" / "claims" / "mini_readme.md").read_text())
    assert "{{" not in text
    assert "**(uncommitted changes)**" in text and "| `mini_sst2_minilm` | 1 | 2 min | 2.0 min |" in text
    assert "SV-Ensemble (M=4): 0.001 (validation nll: 0.0001: 0.600, 0.001: 0.500)" in text
    assert "not built yet" in text  # no tables were built in this fixture
    with pytest.raises(ValueError, match="unknown placeholder"):
        mini_report.render(root, "{{nonsense}}")


def test_status_names_each_row_missing_runs_once_across_tables(tmp_path):
    """The README's status comes from the built tables' "Missing runs" lists: a row shared by two tables (Table 1
    and Table 4; Fig. 3's per-severity form) is named once, and no missing line means complete."""
    tables = tmp_path / "tables"
    tables.mkdir()
    assert "**Complete**" in mini_report.status_section(tmp_path)
    (tables / "a.md").write_text(
        "| x |\n\nMissing runs (–):\n"
        "- exp · SV-Ensemble (M=4): seeds 1, 2 (results/mini/runs/exp/sve_m4)\n"
        "- exp · Single (M=1): seed 0 (results/mini/runs/exp/single_m1)\n"
    )
    (tables / "b.md").write_text(
        "Missing runs (–):\n- exp · SV-Ensemble (M=4): seeds 1, 2 without a per-severity record\n"
    )
    (tables / "c.md").write_text("Missing runs: none.\n")
    text = mini_report.status_section(tmp_path)
    assert text.startswith("**In progress**: 2 rows still miss runs (3 seeds;")
    assert text.count("SV-Ensemble (M=4)") == 1
    assert "- exp · Single (M=1): seed 0" in text and "- exp · SV-Ensemble (M=4): seeds 1, 2" in text


def test_retrained_teachers_are_reported_equal_within_rounding_or_different(tmp_path):
    """reproduced.json's differences: none -> equal to the last digit; within another machine's rounding
    (SAME_RUN) -> the largest, with the CPUs; more -> flagged. Member lists compare element-wise."""

    def record(name: str, differ: dict, numerics=None):
        path = tmp_path / "teachers" / "exp" / name / "seed0"
        path.mkdir(parents=True)
        (path / "reproduced.json").write_text(
            json.dumps({"teacher": f"results/mini/runs/exp/{name}/seed0", "differ": differ, "numerics": numerics or {}})
        )

    record("a", {})
    record(
        "b",
        {"test/nll": [0.40803795, 0.40803803], "test/member_nll": [[0.5, 0.6], [0.5, 0.6000001]]},
        {"committed": None, "retrained": {"cpu": "AMD EPYC"}},
    )
    record("c", {"test/nll": [0.4, 0.41]})
    lines = mini_report.reproduced_section(tmp_path).splitlines()
    assert lines[0] == "- `exp/a/seed0`: equal to the last digit"
    assert lines[1] == (
        "- `exp/b/seed0`: accuracy equal, the other test metrics within 2.0e-07 relative (largest: "
        "`test/nll`; CPUs not recorded then AMD EPYC)"
    )
    assert lines[2].startswith("- `exp/c/seed0`: **differs: 2.4e-02 relative in `test/nll`**")


def test_time_section_says_what_retraining_costs_and_what_a_rebuild_needs(tmp_path):
    # Two parts at a time: 18 h summed over runs is about 9 h of wall time; no target to hold it against.
    write_run(tmp_path, "mini_x", "sve", 4, 0, {"acc": 0.8}, num_members=4, wall_time_s=18 * 3600)
    text = mini_report.times_section(mini_report.all_results(tmp_path))
    assert "about half the sum: 9.0 h (no record" in text
    assert "what retraining everything costs" in text and "in minutes" in text
    assert "target" not in text and "training subsets" not in text


def test_time_section_reports_the_measured_wall_time_of_overlapping_sweeps(tmp_path):
    # Two workers: runs of 0-4 h and 2-8 h overlap, so the wall time is 8 h (not 10).
    write_run(tmp_path, "mini_x", "sve", 4, 0, {"acc": 0.8}, num_members=4, wall_time_s=3600)
    spans = [(0, 4 * 3600, 1), (2 * 3600, 8 * 3600, 2)]
    (tmp_path / "sittings.jsonl").write_text(
        "".join(json.dumps({"started": a, "finished": b, "pid": pid}) + "\n" for a, b, pid in spans)
    )
    text = mini_report.times_section(mini_report.all_results(tmp_path), tmp_path)
    assert "Measured wall time: 8.00 h during which at least one run was training" in text
    assert "2 runs by 2 sweep processes" in text
    assert "target" not in text


def test_the_initial_spread_is_sigma_times_the_root_of_m_minus_one_over_m():
    """Members drawn as the SV layers draw them (s (1 + eps), eps ~ N(0, sigma^2)): their measured spread
    (sve.layers.singular_values.movement) is sigma sqrt((M-1)/M) at initialisation, not sigma."""
    import torch
    from torch import nn

    from sve.layers.singular_values import movement
    from sve.paper.movement import initial_spread

    torch.manual_seed(0)
    for members, sigma in ((2, 0.01), (4, 0.01), (4, 0.005)):
        layer = nn.Module()
        s = torch.rand(20000) + 0.5
        layer.pretrained_singular_values = s
        layer.singular_values = s * (1 + sigma * torch.randn(members, len(s)))
        measured = movement(layer)["member_spread"]
        assert measured == pytest.approx(initial_spread(sigma, members), rel=0.02), (members, sigma)
        assert abs(measured - sigma) > 0.1 * sigma  # sigma itself is the wrong baseline
    assert initial_spread(0.01, 1) == 0.0


def test_the_singular_values_section_gives_each_rows_ratio_to_its_initial_spread(tmp_path):
    def sve_run(seed, moved, method="sve", tune=False, members=4):
        path = write_run(
            tmp_path,
            "mini_x",
            method,
            members,
            seed,
            {"acc": 0.5},
            num_members=members,
            method_report={"svd_seconds": 0.1, **({"singular_values": moved} if moved else {})},
            config={
                "experiment_name": "mini_x",
                "sigma_init": 0.01,
                "method": {"sigma_init": 0.0 if method == "svf" else 0.01},
            },
        )
        if tune:  # a tuning run of the row: not one of its seeds
            target = path.parent.parent / "tune" / "method.lr_0.1" / "results.json"
            target.parent.mkdir(parents=True)
            path.rename(target)

    sve_run(0, {"member_spread": 0.010, "mean_shift": 0.002})
    sve_run(1, {"member_spread": 0.030, "mean_shift": 0.004})
    sve_run(2, None)  # trained before the report kept it
    sve_run(3, {"member_spread": 9.0, "mean_shift": 9.0}, tune=True)
    sve_run(0, {"member_spread": 0.0, "mean_shift": 0.01}, method="svf", members=1)
    sve_run(0, {"member_spread": 0.0088, "mean_shift": 0.01}, method="sve_lora")
    write_run(tmp_path, "mini_x", "lora_ensemble", 4, 0, {"acc": 0.5}, method_report={"rank": 8})
    (tmp_path / "runs" / "mini_x" / "sve_m4" / "seed0" / "REUSED.txt").write_text("a copy of a tuning run\n")
    text = mini_report.singular_values_section(tmp_path)  # the copy is seed 0's run: counted
    # spread 2% over its initial 0.01 sqrt(3/4) = 0.866%: 2.31 times
    assert "| `mini_x` | SV-Ensemble | 4 | 0.01 | 2 of 3 | 2.00 | 0.87 | 2.31 | 0.30 |" in text
    assert "| `mini_x` | SVE + LoRA | 4 | 0.01 | 1 of 1 | 0.88 | 0.87 | 1.02 (not separated) | 1.00 |" in text
    assert "| `mini_x` | Single w/ SVF | 1 | 0.0 | 1 of 1 | 0.00 | 0.00 | one member | 1.00 |" in text
    assert "`mini_x/sve_m4` seed 2" in text and "LoRA-Ensemble" not in text  # no singular values
    # seed 2, trained again by mini_distill.py (teachers/), reports its copy's movement, labelled as such, whether
    # or not its test metrics matched the committed run's to the last digit
    copy = tmp_path / "teachers" / "mini_x" / "sve_m4" / "seed2"
    copy.mkdir(parents=True)
    (copy / "results.json").write_text(
        json.dumps({"method_report": {"singular_values": {"member_spread": 0.020, "mean_shift": 0.003}}})
    )
    (copy / "reproduced.json").write_text(json.dumps({"differ": {"test/acc": [0.5, 0.501]}}))
    text = mini_report.singular_values_section(tmp_path)
    assert "| `mini_x` | SV-Ensemble | 4 | 0.01 | 3 of 3 (1 from `teachers/`)¹ | 2.00 | 0.87 | 2.31 | 0.30 |" in text
    assert "¹ Trained before results.json recorded the movement" in text and "`mini_x/sve_m4` seed" not in text


def test_a_claim_says_in_its_text_which_members_did_not_separate(tmp_path):
    from sve.paper.claims_text import movement_sentences

    for seed in range(2):
        write_run(
            tmp_path,
            "e",
            "sve",
            4,
            seed,
            {"acc": 0.5},
            num_members=4,
            method_report={"svd_seconds": 0.1, "singular_values": {"member_spread": 0.0088, "mean_shift": 0.01}},
            config={"experiment_name": "e", "method": {"sigma_init": 0.01}},
        )
        write_run(
            tmp_path,
            "e",
            "sve",
            2,
            seed,
            {"acc": 0.5},
            num_members=2,
            method_report={"svd_seconds": 0.1, "singular_values": {"member_spread": 0.03, "mean_shift": 0.01}},
            config={"experiment_name": "e", "method": {"sigma_init": 0.01}},
        )
        write_run(tmp_path, "e", "single", 1, seed, {"acc": 0.5}, num_members=1)
    spec = claims({"experiment": "e", "a": "sve:4", "against": ["single:1", "sve:2"], "metrics": ["acc"]})
    sentences = movement_sentences(spec, tmp_path, load_runs(tmp_path))["T"]
    assert sentences == [
        "SV-Ensemble (M=4), Exp: the members' spread is 1.02 times its initial value: the members "
        "did not separate (below 1.2).",
        "SV-Ensemble (M=2), Exp: the members' spread is 4.24 times its initial value.",
    ]
    text = to_markdown(judge(spec, load_runs(tmp_path)), {"T": sentences})
    assert "**Members:** SV-Ensemble (M=4), Exp: the members' spread is 1.02 times" in text


def test_the_settings_name_each_rows_rate_and_its_tuned_diversity_knob(tmp_path):
    row = tmp_path / "runs" / "e" / "sve_m4"
    row.mkdir(parents=True)
    knob = {"key": "sigma_init", "value": "0.03", "metric": "val/nll", "scores": {"0.01": 0.87, "0.03": 0.8667}}
    tuned = {"value": "0.001", "metric": "val/nll", "scores": {"0.001": 0.9}, "from": "svf_m1", "knob": knob}
    (row / "tuned.json").write_text(json.dumps(tuned))
    own = tmp_path / "runs" / "e" / "svf_m1"
    own.mkdir()
    (own / "tuned.json").write_text(json.dumps({**tuned, "from": None, "knob": None, "extended": ["0.0003"]}))
    assert mini_report.learning_rates(tmp_path, "e") == [
        "SV-Ensemble (M=4): 0.001 (the choice of svf_m1), diversity knob sigma_init 0.03 (validation nll: 0.01: 0.870, "
        "0.03: 0.867)",
        "Single w/ SVF (M=1): 0.001 (validation nll: 0.001: 0.900; grid grown by 0.0003)",
    ]
