"""The learning rates ``Ensemble.parameter_groups()`` gives a method when the user names none, each with where it
was measured.

The method configs' own ``lr`` (Appendix C.3's rates, else the recipe's AdamW 1e-3) are what ``train.py`` runs
with *under a recipe that sets the rest*; taken alone by a library user they did not train: SVE at 1e-3 for 50
steps of 16 SST-2 sentences through ``transformers.Trainer`` stayed at chance (52%). The miniature
tuned every method's rate on SST-2 with all-MiniLM-L6-v2 (``make mini``: a grid of half-decades chosen on the
validation NLL at seed 0, ``tuned.json`` in each row's directory), which is the closest measured setting to a
user fine-tuning a pretrained encoder; those rates are the defaults here. A method the miniature did not tune
takes the paper's rate for it: Table 7's SST-2 rate (3e-4, which every method not named in C.3 trains at), or
the rate of the paper the config follows. ``tests/api/test_rates.py`` checks each value against its source file.
"""

from __future__ import annotations

from dataclasses import dataclass

MINI = "results/mini/runs/mini_sst2_minilm"  # the miniature's SST-2 rows (MiniLM-L6, 3 epochs of 2,000 sentences)
TABLE7 = "paper Table 7 (SST-2, BERT-base: AdamW 3e-4; the method is not tuned in the miniature)"
YANG = "Yang et al. (2024), as the method's config cites (not tuned in the miniature)"


@dataclass(frozen=True)
class Rate:
    lr: float
    source: str  # a tuned.json under results/mini (its "value"), or the paper's table
    sv_lr: float | None = None  # the singular values' own rate, where the method has one
    sv_source: str | None = None


RATES = {
    "sve": Rate(1e-2, f"{MINI}/sve_m4/tuned.json"),
    "sve_top": Rate(1e-2, f"{MINI}/sve_top_m4/tuned.json"),
    "sve_top32": Rate(1e-2, f"{MINI}/sve_top32_m4/tuned.json"),
    "svf": Rate(3e-3, f"{MINI}/svf_m1/tuned.json"),
    "sve_lora": Rate(3e-4, f"{MINI}/sve_lora_m4/tuned.json"),
    "sve_lora_shared": Rate(3e-4, f"{MINI}/sve_lora_shared_m4/tuned.json"),
    # The adapters at sve_lora's tuned rate (the row's fix_tuned), the singular values at their own.
    "sve_lora_rates": Rate(
        3e-4, f"{MINI}/sve_lora_m4/tuned.json", sv_lr=1e-2, sv_source=f"{MINI}/sve_lora_rates_m4/tuned.json"
    ),
    "lora_ensemble": Rate(3e-4, f"{MINI}/lora_ensemble_m4/tuned.json"),
    "single_lora": Rate(3e-4, f"{MINI}/single_lora_m1/tuned.json"),
    "bayes_lora_la": Rate(1e-3, f"{MINI}/bayes_lora_la_m10/tuned.json"),
    "single": Rate(3e-5, f"{MINI}/single_m1/tuned.json"),
    "deep_ensemble": Rate(3e-5, f"{MINI}/deep_ensemble_m4/tuned.json"),
    "mc_dropout": Rate(3e-5, f"{MINI}/mc_dropout_m10/tuned.json"),
    "batch_ensemble": Rate(3e-5, f"{MINI}/batch_ensemble_m4/tuned.json"),
    "bayes_lora_llla": Rate(3e-4, TABLE7),
    "blob": Rate(3e-4, TABLE7),
    "checkpoint_ensemble": Rate(3e-4, TABLE7),
    "last_layer_ensemble": Rate(3e-4, TABLE7),
    "deep_ensemble_lora": Rate(5e-5, YANG),
    "mc_dropout_lora": Rate(5e-5, YANG),
    "single_lora_yang": Rate(5e-5, YANG),
}


def default_lr(method: str) -> float | None:
    """The library's default rate of ``method`` (a config name); None for a method of the user's own configs,
    which has no measured row (``parameter_groups`` then takes its config's rate)."""
    rate = RATES.get(method)
    return rate.lr if rate is not None else None


def default_options(method: str) -> dict:
    """Option defaults that replace the config's in ``wrap``: the singular values' own measured rate."""
    rate = RATES.get(method)
    return {"sv_lr": rate.sv_lr} if rate is not None and rate.sv_lr is not None else {}
