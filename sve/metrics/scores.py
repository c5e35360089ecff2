"""The evaluator: accuracy, ECE, NLL and Brier score of the ensemble predictive (Appendix E).

All inputs are predictive probabilities (B, C) from ``sve.members.predictive``; every state is float64 and
every state is a sum, so the metrics are exact under DDP (``dist_reduce_fx="sum"``) and independent of batch
boundaries. Units: ``acc`` and ``ece`` are fractions in [0, 1] (the paper's tables print them x100),
``nll`` is in nats per example, ``brier`` is the sum over classes of squared errors (Eq. 13), in [0, 2].

ECE (Eq. 9-11, Guo et al. 2017): the confidence of a prediction is its maximum probability; 15 equal-width
bins with right-closed edges ((m-1)/15, m/15], so a confidence of exactly 1.0 falls into the last bin and a
confidence on an inner edge into the lower bin. Predicted label = first index of the maximum (ties go to the
lower class index, as numpy's and torch's argmax).

Beyond the paper (extra columns, never replacing the above), from the member logits of a whole evaluation
set (``score``): per-member accuracy, ECE, NLL and Brier; member disagreement and mutual information (below);
the reliability-diagram bins of the ECE; and selective prediction's AURC and risk-coverage curve
(``sve.metrics.selective``). ``ood_scores``: the OOD detection metrics of an in-distribution and an OOD set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.utilities import dim_zero_cat

from sve.members import predictive
from sve.metrics.selective import selective_scores

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


def ece_bin_index(confidence: Tensor, n_bins: int) -> Tensor:
    """The ECE bin (0 .. n_bins - 1) of each float64 confidence: right-closed bins ((m-1)/n, m/n], 0 in the first."""
    # Edges k / n, each the nearest double to k/n, so a confidence is compared with k/n itself; torch.linspace
    # misses some by one ulp (edge 11 of 15 lies above 11/15), which moved a confidence on or just beside such an
    # edge into the neighbouring bin.
    edges = torch.arange(n_bins + 1, dtype=torch.float64, device=confidence.device) / n_bins
    return (torch.searchsorted(edges, confidence, right=False) - 1).clamp(0, n_bins - 1)


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
        index = ece_bin_index(confidence, self.n_bins)
        self.bin_count += torch.bincount(index, minlength=self.n_bins).double()
        self.bin_confidence += torch.zeros_like(self.bin_confidence).index_add_(0, index, confidence)
        correct = (predicted == target.long()).double()
        self.bin_correct += torch.zeros_like(self.bin_correct).index_add_(0, index, correct)

    def compute(self) -> Tensor:
        n = self.bin_count.sum()
        gap = (self.bin_correct - self.bin_confidence).abs()  # |B|*|acc(B) - conf(B)| per bin
        return gap.sum() / n

    def bins(self) -> dict[str, list]:
        """The reliability diagram: per bin the example count, mean confidence and accuracy (None for an empty
        bin: a mean over nothing, and JSON has no NaN)."""
        count = [int(c) for c in self.bin_count.tolist()]
        mean = lambda sums: [s / c if c else None for s, c in zip(sums.tolist(), count)]  # noqa: E731
        return {"count": count, "confidence": mean(self.bin_confidence), "accuracy": mean(self.bin_correct)}


def adaptive_ece(probs: Tensor, labels: Tensor, n_bins: int = 15) -> float:
    """The equal-mass (adaptive) ECE (Nixon et al., 2019): the examples sorted by confidence and cut into
    ``n_bins`` bins of equal count (the first N mod n_bins bins one example larger, as ``torch.tensor_split``
    cuts), then the ECE's sum over bins of |correct - confidence| / N. Tied confidences cut by a bin edge would make
    the number depend on the data's order; each example counts its tie group's accuracy instead (as the
    risk-coverage curve does, ``sve.metrics.selective``): a bin's count of correct examples is then its expectation
    over the orders of the tie, the same in every order. Without ties it is torch-uncertainty's
    ``AdaptiveCalibrationError`` (l1)."""
    confidence, predicted = probs.double().max(-1)
    correct = (predicted == labels.long()).double()
    order = torch.argsort(confidence, stable=True)
    confidence, correct = confidence[order], correct[order]
    _, group, size = torch.unique_consecutive(confidence, return_inverse=True, return_counts=True)
    correct = (torch.zeros(len(size), dtype=torch.float64).index_add_(0, group, correct) / size)[group]
    gaps = [(c.sum() - a.sum()).abs() for c, a in zip(confidence.tensor_split(n_bins), correct.tensor_split(n_bins))]
    return float(sum(gaps) / len(confidence))


def classification_metrics(n_bins: int = 15, **kwargs) -> MetricCollection:
    """The metric set reported for every run, keyed as in ``results.json``; ``kwargs`` go to every metric
    (``sync_on_compute=False`` where each process already holds the whole set)."""
    return MetricCollection(
        {
            "acc": Accuracy(**kwargs),
            "ece": ExpectedCalibrationError(n_bins=n_bins, **kwargs),
            "nll": NegativeLogLikelihood(**kwargs),
            "brier": BrierScore(**kwargs),
        },
        # torchmetrics' compute groups merge metrics whose states are allclose after the first update and from
        # then on update only one of them: acc, nll and brier share the state names (total, count), so a first
        # batch of confident correct predictions (nll and brier totals both ~0) made nll report brier's number
        # (or the reverse) for the whole set. The metrics are cheap; each keeps its own state.
        compute_groups=False,
    )


UNITS = {
    "acc": "fraction correct in [0, 1]",
    "ece": "fraction in [0, 1], 15 equal-width bins",
    "nll": "nats per example",
    "brier": "sum over classes of squared error, per example, in [0, 2]",
    "ood_auroc": "fraction in [0, 1]; in-distribution = positive, score = max probability",
    "ood_auprc": "fraction in [0, 1]; in-distribution = positive",
    "ood_fpr95": "fraction of OOD inputs accepted at 95% in-distribution recall",
    "ood_auroc_mi": "as ood_auroc with score = minus the mutual information (runs of more than one member)",
    "ood_auprc_mi": "as ood_auprc with score = minus the mutual information (runs of more than one member)",
    "ood_fpr95_mi": "as ood_fpr95 with score = minus the mutual information (runs of more than one member)",
    "aurc": "fraction in [0, 1]: the mean error rate of the k most confident examples over k = 1..N (lower is better)",
    "augrc": "fraction in [0, 1]: the mean over k = 1..N of the errors among the k most confident examples / N",
    "adaptive_ece": "fraction in [0, 1], 15 equal-count bins of the examples sorted by confidence",
    "disagreement": "fraction in [0, 1] of (member, example) pairs whose argmax differs from the predictive's",
    "mutual_information": "nats per example: predictive entropy minus mean member entropy",
    "temperature": "T > 0 fitted on the validation split; calibrated probabilities = softmax(log p / T)",
    "ts_acc": "as acc, after temperature scaling",
    "ts_ece": "as ece, after temperature scaling",
    "ts_nll": "as nll, after temperature scaling",
}


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats over the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(probs, probs).sum(-1)


@dataclass
class Prediction:
    """An ensemble's prediction for a batch with its uncertainty (``uncertainty``); every field is per example.

    ``entropy`` is the total uncertainty H(p), ``expected_entropy`` the members' own (aleatoric) part
    mean_m H(p_m), ``mutual_information`` the part that comes from their disagreement (epistemic): with
    ``aggregate="probs"`` (the paper's Eq. 2) the first is the sum of the other two. ``disagreement`` is the
    fraction of members whose class differs from the ensemble's."""

    probs: Tensor  # (B, C) the ensemble predictive
    label: Tensor  # (B,) its class (the first maximum)
    confidence: Tensor  # (B,) its probability
    entropy: Tensor  # (B,) nats
    expected_entropy: Tensor  # (B,) nats
    mutual_information: Tensor  # (B,) nats, in [0, log M]
    disagreement: Tensor  # (B,) in [0, 1]
    member_probs: Tensor  # (M, B, C)
    sets: Tensor | None = None  # (B, C) bool: the conformal sets, once the ensemble is conformalized


def uncertainty(member_logits: Tensor, aggregate: str = "probs") -> Prediction:
    """The prediction and uncertainty of member logits (M, B, C), in float64. The mutual information (Depeweg et
    al., 2018) is I = H(mean_m p_m) - mean_m H(p_m), always from the mean of member probabilities, whatever
    ``aggregate`` the predictive uses: zero when the members agree, at most log M."""
    member_probs = member_logits.double().softmax(-1)
    probs = predictive(member_logits, aggregate)
    confidence, label = probs.max(-1)
    expected = entropy(member_probs).mean(0)
    return Prediction(
        probs=probs,
        label=label,
        confidence=confidence,
        entropy=entropy(probs),
        expected_entropy=expected,
        mutual_information=entropy(member_probs.mean(0)) - expected,
        disagreement=(member_logits.argmax(-1) != label).double().mean(0),
        member_probs=member_probs,
    )


def mutual_information(member_logits: Tensor) -> float:
    """``uncertainty``'s mutual information, averaged over examples."""
    return float(uncertainty(member_logits).mutual_information.mean())


def disagreement(member_logits: Tensor, probs: Tensor) -> float:
    """Fraction of (member, example) pairs whose member argmax differs from that of the ensemble predictive
    ``probs`` (N, C); zero for one member."""
    return float((member_logits.argmax(-1) != probs.argmax(-1)).double().mean())


def predictive_metrics(probs: Tensor, labels: Tensor, n_bins: int = 15) -> dict[str, float]:
    """``classification_metrics`` of probabilities (N, C) that this process holds in full."""
    metrics = classification_metrics(n_bins, sync_on_compute=False)
    metrics.update(probs, labels)
    return {k: float(v) for k, v in metrics.compute().items()}


def score(member_logits: Tensor, labels: Tensor, aggregate: str, n_bins: int = 15, probs: Tensor | None = None) -> dict:
    """Every metric of one evaluation set from its member logits (M, N, C) and labels (N,): the predictive's
    ``acc``, ``ece``, ``nll``, ``brier``; per member ``member_acc`` etc. (lists of length M); ``disagreement``,
    ``mutual_information``; ``adaptive_ece``; ``aurc``, ``augrc`` and the ``risk_coverage`` curve
    (``sve.metrics.selective``); and ``reliability`` (the ECE's bins). Each process must hold the whole set.
    ``probs``: the predictive ``predictive(member_logits, aggregate)``, where the caller holds it already."""
    labels = labels.long()
    probs = predictive(member_logits, aggregate) if probs is None else probs
    overall = classification_metrics(n_bins, sync_on_compute=False)
    overall.update(probs, labels)
    out = {k: float(v) for k, v in overall.compute().items()}
    out["reliability"] = overall["ece"].bins()
    for member in member_logits:
        for k, v in predictive_metrics(member.double().softmax(-1), labels, n_bins).items():
            out.setdefault(f"member_{k}", []).append(v)
    out["disagreement"] = disagreement(member_logits, probs)
    out["mutual_information"] = mutual_information(member_logits)
    out["adaptive_ece"] = adaptive_ece(probs, labels, n_bins)
    out.update(selective_scores(probs, labels))
    return out


def ood_scores(
    inside: Tensor,
    outside: Tensor,
    aggregate: str,
    inside_probs: Tensor | None = None,
    outside_probs: Tensor | None = None,
) -> dict[str, float]:
    """OOD detection of an in-distribution set from an OOD one, from their member logits (M, N, C): ``ood_auroc``,
    ``ood_auprc``, ``ood_fpr95`` scored by the predictive's maximum probability; with more than one member also
    ``ood_auroc_mi``, ``ood_auprc_mi``, ``ood_fpr95_mi`` scored by minus the mutual information (zero for one
    member, so no score then). ``inside_probs``, ``outside_probs``: the predictives, where the caller holds them."""
    by_confidence = OODDetection(sync_on_compute=False)
    for logits, probs, is_inside in ((inside, inside_probs, True), (outside, outside_probs, False)):
        by_confidence.update(predictive(logits, aggregate) if probs is None else probs, in_distribution=is_inside)
    out = {f"ood_{k}": float(v) for k, v in by_confidence.compute().items()}
    if inside.shape[0] > 1:
        by_mi = OODDetection(sync_on_compute=False)
        for logits, is_inside in ((inside, True), (outside, False)):
            by_mi.update_scores(-uncertainty(logits).mutual_information, is_inside)
        out.update({f"ood_{k}_mi": float(v) for k, v in by_mi.compute().items()})
    return out


class OODDetection(Metric):
    """AUROC, AUPRC and FPR at 95% TPR for separating in-distribution (positive) from OOD inputs (E.5-E.7).

    The score is the maximum predictive probability (Hendrycks and Gimpel, 2016). Scores are gathered with
    ``cat`` states, so uneven per-rank counts under DDP are fine. All three are fractions in [0, 1] and depend
    only on the order of the scores (ties included), so any real-valued score works; a NaN score is refused
    (``FloatingPointError``).
    """

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("in_distribution", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, in_distribution: bool, is_score: bool = False) -> None:
        """``probs`` (B, C), scored by their maximum; or with ``is_score`` a per-example score (B,) as it is."""
        score = (probs if is_score else probs.max(-1).values).double()
        self.scores.append(score)
        self.in_distribution.append(torch.full_like(score, float(in_distribution)))

    def update_scores(self, score: Tensor, in_distribution: bool) -> None:
        """Any per-example score, higher meaning more in-distribution (e.g. minus the mutual information). Through
        ``update``, which torchmetrics wraps to drop an earlier ``compute``'s cached result."""
        self.update(score, in_distribution, is_score=True)

    def compute(self) -> dict[str, Tensor]:
        from torchmetrics.functional.classification import binary_auroc, binary_average_precision, binary_roc

        scores = dim_zero_cat(self.scores)
        target = dim_zero_cat(self.in_distribution).long()
        if target.min() == target.max():
            raise ValueError("OOD detection needs both in-distribution and OOD scores")
        # torchmetrics ranks NaN scores somewhere and returns finite areas, so NaN logits on the OOD set (which no
        # other metric reads) would have reached results.json as plausible numbers.
        nan = torch.isnan(scores)
        if nan.any():
            raise FloatingPointError(
                f"OOD detection got NaN scores ({int((nan & (target == 1)).sum())} "
                f"in-distribution, {int((nan & (target == 0)).sum())} OOD); the member "
                "logits hold NaN"
            )
        # torchmetrics passes scores outside [0, 1] through a sigmoid, which in float64 rounds every score above
        # ~37 to 1.0 and ties them (an energy score, say). The curves depend only on the order and the ties of
        # the scores, so they are fed dense ranks scaled into [0, 1], which keep both exactly.
        ranks = torch.unique(scores, return_inverse=True)[1].double()
        scores = ranks / ranks.max().clamp_min(1)
        fpr, tpr, _ = binary_roc(scores, target)  # thresholds in decreasing order, tpr non-decreasing
        return {
            "auroc": binary_auroc(scores, target),
            "auprc": binary_average_precision(scores, target),
            "fpr95": fpr[torch.nonzero(tpr >= 0.95)[0, 0]],
        }
