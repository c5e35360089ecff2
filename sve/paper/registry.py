"""What the tables know about metrics and methods: each metric's direction, display scale and digits
(``METRICS``), and the paper's names for the methods (``METHOD_NAMES``). Read by the sweep, the tables, the
figures and the claims alike."""

from __future__ import annotations

from dataclasses import dataclass


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
        # A distilled student's inference speed-up over its teacher (results.json cost, one process).
        Metric("speedup", "Speed-up (x)", True, 1, 1),
    )
}

# The paper's names for the methods (its tables' row labels).
METHOD_NAMES = {
    "single": "Single",
    "svf": "Single w/ SVF",
    "single_lora": "Single w/ LoRA",
    "single_lora_yang": "Single (LoRA, Yang et al.)",  # Table 3's rows run on LoRA as their source did
    "mc_dropout": "MC Dropout",
    "mc_dropout_lora": "MC Dropout (LoRA)",
    "deep_ensemble": "Deep Ensemble",
    "deep_ensemble_lora": "Deep Ensemble (LoRA)",
    "batch_ensemble": "Batch Ensemble",
    "lora_ensemble": "LoRA-Ensemble",
    "bayes_lora_llla": "Bayes-LoRA (LLLA)",
    "bayes_lora_la": "Bayes-LoRA (LA)",
    "blob": "Blob",
    "last_layer_ensemble": "Last-Layer Ensemble",
    "checkpoint_ensemble": "Ckpt Ensemble",
    "sve": "SV-Ensemble",
    # Beyond the paper (its Sec. 6 future work): sve.layers.sv_lora
    "sve_lora": "SVE + LoRA",
    "sve_lora_shared": "SVE + shared LoRA",
    "sve_lora_rates": "SVE + LoRA (own SV rate)",  # method.sv_lr tuned apart from the adapters' rate
    "sve_top": "SVE (top-8)",  # beyond the paper: sve.layers.sv_top
    "sve_top32": "SVE (top-32)",
    "distilled_mean": "Distilled (mean)",  # sve-distill: sve.runs.distillation
    "distilled_dirichlet": "Distilled (Dirichlet, EnD^2)",
}
