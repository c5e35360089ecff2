"""The evaluator: accuracy, ECE, NLL and Brier score of the ensemble predictive (Appendix E).

All inputs are predictive probabilities (B, C) from ``sve.members.predictive``; every state is float64 and
every state is a sum, so the metrics are exact under DDP (``dist_reduce_fx="sum"``) and independent of batch
boundaries. Units: ``acc`` and ``ece`` are fractions in [0, 1] (the paper's tables print them x100),
``nll`` is in nats per example, ``brier`` is the sum over classes of squared errors (Eq. 13), in [0, 2].

ECE (Eq. 9-11, Guo et al. 2017): the confidence of a prediction is its maximum probability; 15 equal-width
bins with right-closed edges ((m-1)/15, m/15], so a confidence of exactly 1.0 falls into the last bin and a
confidence on an inner edge into the lower bin. Predicted label = first index of the maximum (ties go to the
lower class index, as numpy's and torch's argmax).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.utilities import dim_zero_cat

NLL_EPS = 1e-12  # probabilities are clamped here before the log, so one zero-probability label is finite


class _MeanMetric(Metric):
    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def per_example(self, probs: Tensor, target: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def update(self, probs: Tensor, target: Tensor) -> None:
        values = self.per_example(probs.double(), target.long())
        self.total += values.sum()
        self.count += values.numel()

    def compute(self) -> Tensor:
        return self.total / self.count


class Accuracy(_MeanMetric):
    higher_is_better = True

    def per_example(self, probs, target):
        return (probs.argmax(-1) == target).double()


class NegativeLogLikelihood(_MeanMetric):
    def per_example(self, probs, target):
        return -probs.gather(-1, target[:, None]).squeeze(-1).clamp_min(NLL_EPS).log()


class BrierScore(_MeanMetric):
    def per_example(self, probs, target):
        onehot = torch.nn.functional.one_hot(target, probs.shape[-1]).double()
        return ((probs - onehot) ** 2).sum(-1)


class ExpectedCalibrationError(Metric):
    full_state_update = False
    higher_is_better = False

    def __init__(self, n_bins: int = 15, **kwargs):
        super().__init__(**kwargs)
        self.n_bins = n_bins
        for name in ("bin_count", "bin_confidence", "bin_correct"):
            self.add_state(name, torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: Tensor, target: Tensor) -> None:
        probs = probs.double()
        confidence, predicted = probs.max(-1)
        # Right-closed bins: ceil(conf * n) - 1, with conf == 0 sent to the first bin.
        edges = torch.linspace(0, 1, self.n_bins + 1, dtype=torch.float64, device=probs.device)
        index = (torch.searchsorted(edges, confidence, right=False) - 1).clamp(0, self.n_bins - 1)
        self.bin_count += torch.bincount(index, minlength=self.n_bins).double()
        self.bin_confidence += torch.zeros_like(self.bin_confidence).index_add_(0, index, confidence)
        correct = (predicted == target.long()).double()
        self.bin_correct += torch.zeros_like(self.bin_correct).index_add_(0, index, correct)

    def compute(self) -> Tensor:
        n = self.bin_count.sum()
        gap = (self.bin_correct - self.bin_confidence).abs()  # |B|*|acc(B) - conf(B)| per bin
        return gap.sum() / n


def classification_metrics(n_bins: int = 15) -> MetricCollection:
    """The metric set reported for every run, keyed as in ``results.json``."""
    return MetricCollection(
        {
            "acc": Accuracy(),
            "ece": ExpectedCalibrationError(n_bins=n_bins),
            "nll": NegativeLogLikelihood(),
            "brier": BrierScore(),
        }
    )


UNITS = {
    "acc": "fraction correct in [0, 1]",
    "ece": "fraction in [0, 1], 15 equal-width bins",
    "nll": "nats per example",
    "brier": "sum over classes of squared error, per example, in [0, 2]",
    "ood_auroc": "fraction in [0, 1]; in-distribution = positive, score = max probability",
    "ood_auprc": "fraction in [0, 1]; in-distribution = positive",
    "ood_fpr95": "fraction of OOD inputs accepted at 95% in-distribution recall",
}


class OODDetection(Metric):
    """AUROC, AUPRC and FPR at 95% TPR for separating in-distribution (positive) from OOD inputs (E.5-E.7).

    The score is the maximum predictive probability (Hendrycks and Gimpel, 2016). Scores are gathered with
    ``cat`` states, so uneven per-rank counts under DDP are fine. All three are fractions in [0, 1].
    """

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("in_distribution", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, in_distribution: bool) -> None:
        score = probs.double().max(-1).values
        self.scores.append(score)
        self.in_distribution.append(torch.full_like(score, float(in_distribution)))

    def compute(self) -> dict[str, Tensor]:
        from torchmetrics.functional.classification import binary_auroc, binary_average_precision, binary_roc

        scores = dim_zero_cat(self.scores)
        target = dim_zero_cat(self.in_distribution).long()
        if target.min() == target.max():
            raise ValueError("OOD detection needs both in-distribution and OOD scores")
        fpr, tpr, _ = binary_roc(scores, target)  # thresholds in decreasing order, tpr non-decreasing
        return {
            "auroc": binary_auroc(scores, target),
            "auprc": binary_average_precision(scores, target),
            "fpr95": fpr[torch.nonzero(tpr >= 0.95)[0, 0]],
        }
