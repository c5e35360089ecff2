"""How the tables show metrics and methods: each metric's direction, display scale and digits
(``METRICS``), and the methods' row labels (``METHOD_NAMES``, read from the registry of methods). Read by the
sweep, the tables, the figures and the claims alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sve.methods import registry


@dataclass(frozen=True)
class Metric:
    key: str  # results.json metrics key without the "test/" prefix
    label: str
    higher_is_better: bool | None  # None: a description, not a score (no best or second best)
    scale: float  # displayed value = stored value * scale (fractions are printed in %, as the paper does)
    digits: int

    @property
    def arrow(self) -> str:
        return {True: "↑", False: "↓", None: ""}[self.higher_is_better]


METRICS = {
    m.key: m
    for m in (
        Metric("acc", "Acc (%)", True, 100, 1),
        Metric("ece", "ECE (%)", False, 100, 1),
        Metric("nll", "NLL", False, 1, 2),
        Metric("brier", "Brier", False, 1, 2),
        Metric("ood_auroc", "AUROC (%)", True, 100, 1),
        Metric("ood_auroc_mi", "AUROC by MI (%)", True, 100, 1),
        Metric("ood_auprc", "AUPRC (%)", True, 100, 1),
        Metric("ood_fpr95", "FPR95 (%)", False, 100, 1),
        # Table 5, from results/bench/table5.json, relative to the single model (sve.paper.report.cost_runs).
        Metric("trainable_param_pct", "Trainable param. (% of base)", False, 1, 1),
        Metric("param_overhead_pct", "Stored param. overhead (%)", False, 1, 1),
        Metric("train_memory_overhead_pct", "Train memory overhead (%)", False, 1, 1),
        Metric("infer_memory_overhead_pct", "Infer. memory overhead (%)", False, 1, 1),
        Metric("infer_gflops", "Infer. GFLOPs", False, 1, 1),
        Metric("infer_ms", "Infer. time (ms)", False, 1, 1),
        # Beyond the paper (sve.runs.evaluation), for tables that list them beside the paper's columns.
        Metric("ts_acc", "TS Acc (%)", True, 100, 1),
        Metric("ts_ece", "TS ECE (%)", False, 100, 1),
        Metric("ts_nll", "TS NLL", False, 1, 2),
        Metric("temperature", "T", None, 1, 2),
        Metric("disagreement", "Disagr. (%)", None, 100, 1),
        Metric("mutual_information", "MI (nats)", None, 1, 3),
        Metric("aurc", "AURC (%)", False, 100, 2),  # selective prediction (sve.metrics.selective); newer runs only
        # Split conformal sets at 90% and 95% coverage, THR score and (aps_) APS, from each run's saved test
        # predictive over repeated calibration/test splits (sve.paper.conformal_splits). Coverage is a description:
        # it should be near its level, not as high as possible.
        Metric("coverage_90", "Cov. 90 (%)", None, 100, 1),
        Metric("set_size_90", "Size 90", False, 1, 2),
        Metric("coverage_95", "Cov. 95 (%)", None, 100, 1),
        Metric("set_size_95", "Size 95", False, 1, 2),
        Metric("aps_coverage_90", "APS cov. 90 (%)", None, 100, 1),
        Metric("aps_set_size_90", "APS size 90", False, 1, 2),
        Metric("aps_coverage_95", "APS cov. 95 (%)", None, 100, 1),
        Metric("aps_set_size_95", "APS size 95", False, 1, 2),
        Metric("mi_coverage_90", "MI cov. 90 (%)", None, 100, 1),  # thr_mi: sets that follow the disagreement
        Metric("mi_set_size_90", "MI size 90", False, 1, 2),
        Metric("mi_coverage_95", "MI cov. 95 (%)", None, 100, 1),
        Metric("mi_set_size_95", "MI size 95", False, 1, 2),
        Metric("growth_90", "Growth 90", True, 1, 2),  # sets' size where members disagree most minus elsewhere
        Metric("growth_95", "Growth 95", True, 1, 2),
        Metric("mi_saving_90", "MI saving 90", True, 1, 3),  # THR size minus thr_mi size
        Metric("mi_saving_95", "MI saving 95", True, 1, 3),
        # A distilled student's inference speed-up over its teacher (results.json cost, one process).
        Metric("speedup", "Speed-up (x)", True, 1, 1),
    )
}


class MethodNames(Mapping):
    """The row label of every method option, read from the registry of methods (``sve.methods.registry``: each
    class's ``display_name``), and of the students ``sve-distill`` writes. Read-only and lazy: a label costs the
    composition of its option (and the import of its class) the first time it is asked for."""

    def __getitem__(self, method: str) -> str:
        if method in DISTILLED_NAMES:
            return DISTILLED_NAMES[method]
        if method not in registry.options():
            raise KeyError(method)
        return registry.display_name(method)

    def __iter__(self):
        return iter([*registry.options(), *DISTILLED_NAMES])

    def __len__(self) -> int:
        return len(registry.options()) + len(DISTILLED_NAMES)


# Students distilled from an ensemble (sve-distill: sve.runs.distillation), by objective: results, not method options.
DISTILLED_NAMES = {"distilled_mean": "Distilled (mean)", "distilled_dirichlet": "Distilled (Dirichlet, EnD^2)"}
METHOD_NAMES = MethodNames()  # the tables' row labels
