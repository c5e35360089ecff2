"""The evaluator against an independent numpy reference (Appendix E), including edge cases."""

import numpy as np
import pytest
import torch

from sve.members import predictive
from sve.metrics.scores import NLL_EPS, classification_metrics


def reference(probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """Straight from Eq. 8-13 with explicit loops; bins ((m-1)/n, m/n], 0 in the first bin."""
    n = len(labels)
    pred = np.array([int(np.flatnonzero(p == p.max())[0]) for p in probs])  # first maximum
    conf = probs.max(1)
    correct = (pred == labels).astype(float)
    ece = 0.0
    for m in range(1, n_bins + 1):
        lo, hi = (m - 1) / n_bins, m / n_bins
        in_bin = [(lo < c <= hi) or (m == 1 and c == 0) for c in conf]
        if any(in_bin):
            idx = np.flatnonzero(in_bin)
            ece += len(idx) / n * abs(correct[idx].mean() - conf[idx].mean())
    onehot = np.eye(probs.shape[1])[labels]
    return {
        "acc": correct.mean(),
        "ece": ece,
        "nll": float(np.mean([-np.log(max(probs[i, labels[i]], NLL_EPS)) for i in range(n)])),
        "brier": float(np.mean(((probs - onehot) ** 2).sum(1))),
    }


def compute(probs, labels, chunks=1):
    metrics = classification_metrics()
    for p, y in zip(np.array_split(probs, chunks), np.array_split(labels, chunks)):
        metrics.update(torch.from_numpy(p), torch.from_numpy(y))
    return {k: float(v) for k, v in metrics.compute().items()}


def check(probs, labels, chunks=1):
    got, ref = compute(probs, labels, chunks), reference(probs, labels)
    for key in ("acc", "ece", "nll", "brier"):
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key


@pytest.mark.parametrize("chunks", [1, 7])
def test_random_predictions(chunks):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(500, 10)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    check(probs, rng.integers(0, 10, 500), chunks)


def test_confidence_exactly_one_and_all_correct():
    probs = np.eye(4)[[0, 1, 2, 3, 0]].astype(float)
    labels = np.array([0, 1, 2, 3, 0])
    check(probs, labels)
    got = compute(probs, labels)
    assert got["acc"] == 1 and got["ece"] == 0 and got["brier"] == 0 and got["nll"] == pytest.approx(0)


def test_all_wrong_with_certainty():
    probs = np.eye(3)[[1, 2, 0]].astype(float)
    labels = np.array([0, 1, 2])
    check(probs, labels)
    got = compute(probs, labels)
    assert got["acc"] == 0 and got["ece"] == pytest.approx(1) and got["brier"] == pytest.approx(2)
    assert got["nll"] == pytest.approx(-np.log(NLL_EPS))


def test_ties_predict_the_first_class():
    probs = np.array([[0.4, 0.4, 0.2], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    labels = np.array([0, 1, 1])
    check(probs, labels)
    assert compute(probs, labels)["acc"] == pytest.approx(1 / 3)


def test_hand_computed_ece():
    # Two bins used: conf 0.9 (right) and 0.9 (wrong) -> |0.5-0.9| weight 2/3; conf 0.6 right -> |1-0.6| 1/3
    probs = np.array([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4]])
    labels = np.array([0, 0, 0])
    assert compute(probs, labels)["ece"] == pytest.approx(2 / 3 * 0.4 + 1 / 3 * 0.4)


def test_predictive_mean_of_probabilities_vs_logits():
    logits = torch.tensor([[[4.0, 0.0]], [[0.0, 2.0]]])  # (M=2, B=1, C=2)
    p = predictive(logits, "probs")
    expected = (torch.softmax(logits[0], -1) + torch.softmax(logits[1], -1)) / 2
    torch.testing.assert_close(p, expected.double())
    torch.testing.assert_close(predictive(logits, "logits"), torch.softmax(logits.mean(0), -1).double())
    assert p.dtype == torch.float64
    with pytest.raises(ValueError, match="probs"):
        predictive(logits, "median")


# --- beyond the paper: member metrics, disagreement, mutual information, reliability -----------------------------


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference_mutual_information(member_logits: np.ndarray) -> float:
    """Explicit loops over examples: H(mean p) - mean_m H(p_m)."""
    p = softmax(member_logits)  # (M, N, C)
    h = lambda q: -sum(x * np.log(x) for x in q if x > 0)  # noqa: E731
    return float(
        np.mean([h(p[:, i].mean(0)) - np.mean([h(p[m, i]) for m in range(len(p))]) for i in range(p.shape[1])])
    )


def test_mutual_information_against_numpy_and_its_bounds():
    from sve.metrics.scores import mutual_information

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 40, 6)) * 2
    expected = reference_mutual_information(logits)
    assert mutual_information(torch.from_numpy(logits)) == pytest.approx(expected, abs=1e-12)
    agree = np.repeat(logits[:1], 5, axis=0)  # five identical members: no epistemic part
    assert mutual_information(torch.from_numpy(agree)) == pytest.approx(0, abs=1e-12)
    # Two confident members on different classes: the predictive is 50/50, each member certain: I = log 2.
    apart = np.full((2, 3, 4), -1e4)
    apart[0, :, 0] = apart[1, :, 1] = 0
    assert mutual_information(torch.from_numpy(apart)) == pytest.approx(np.log(2), abs=1e-12)


def test_disagreement_against_numpy():
    from sve.metrics.scores import disagreement

    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 50, 4))
    probs = softmax(logits).mean(0)
    expected = np.mean([[logits[m, i].argmax() != probs[i].argmax() for i in range(50)] for m in range(3)])
    assert disagreement(torch.from_numpy(logits), torch.from_numpy(probs)) == pytest.approx(expected, abs=1e-15)
    assert disagreement(torch.from_numpy(logits[:1]), torch.from_numpy(softmax(logits[0]))) == 0
    # Hand-made: members predict classes (0, 1, 1) for example 0 and (2, 2, 2) for example 1; the ensemble
    # says 1 and 2, so one of six (member, example) pairs disagrees.
    hand = np.zeros((3, 2, 3))
    for m, classes in enumerate([(0, 2), (1, 2), (1, 2)]):
        for i, c in enumerate(classes):
            hand[m, i, c] = 5.0
    assert disagreement(torch.from_numpy(hand), torch.from_numpy(softmax(hand).mean(0))) == pytest.approx(1 / 6)


@pytest.mark.parametrize("aggregate", ["probs", "logits"])
def test_score_holds_every_member_and_the_ece_bins(aggregate):
    from sve.metrics.scores import score

    rng = np.random.default_rng(3)
    logits, labels = rng.normal(size=(4, 300, 7)) * 3, rng.integers(0, 7, 300)
    got = score(torch.from_numpy(logits), torch.from_numpy(labels), aggregate)
    probs = softmax(logits).mean(0) if aggregate == "probs" else softmax(logits.mean(0))
    ref = reference(probs, labels)
    for key in ("acc", "ece", "nll", "brier"):
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key
        members = [reference(softmax(m), labels)[key] for m in logits]
        assert got[f"member_{key}"] == pytest.approx(members, abs=1e-12), key
    # Reliability bins: right-closed ((m-1)/15, m/15], counted and averaged with explicit loops.
    bins = got["reliability"]
    conf, correct = probs.max(1), probs.argmax(1) == labels
    for m in range(15):
        inside = [(m / 15 < c <= (m + 1) / 15) or (m == 0 and c == 0) for c in conf]
        assert bins["count"][m] == sum(inside)
        if sum(inside):
            assert bins["confidence"][m] == pytest.approx(conf[inside].mean(), abs=1e-12)
            assert bins["accuracy"][m] == pytest.approx(correct[inside].mean(), abs=1e-12)
        else:
            assert bins["confidence"][m] is None and bins["accuracy"][m] is None


@pytest.mark.parametrize("aggregate", ["probs", "logits"])
def test_log_predictive_is_the_log_of_the_predictive_without_underflow(aggregate):
    from sve.members import log_predictive

    rng = np.random.default_rng(4)
    logits = torch.from_numpy(rng.normal(size=(3, 20, 5)) * 4)
    torch.testing.assert_close(log_predictive(logits, aggregate).exp(), predictive(logits, aggregate))
    far = torch.tensor([[[0.0, -2000.0]], [[0.0, -2000.0]]])  # exp(-2000) is 0 in float64; its log is not -inf
    assert float(log_predictive(far, aggregate)[0, 1]) == pytest.approx(-2000.0)


def test_confidences_on_and_one_ulp_beside_every_bin_edge():
    # torch.linspace(0, 1, n + 1) misses some k/n by one ulp (edge 11 of 15 lies above 11/15, so nextafter(11/15, 1)
    # went to the lower bin; also edge 3 of 10 and edges 3, 6, 7, 11 of 20). The reference compares with m/n itself.
    for n_bins in (10, 15, 20):
        conf = np.array(
            [
                c
                for k in range(1, n_bins + 1)
                for c in (k / n_bins, np.nextafter(k / n_bins, 0), np.nextafter(k / n_bins, 1))
                if c <= 1
            ]
        )
        n_classes = 21  # the other 20 classes share 1 - c, below c for every c >= 1/20; class 0 is the prediction
        probs = np.column_stack([conf] + [(1 - conf) / (n_classes - 1)] * (n_classes - 1))
        edges = np.arange(n_bins + 1) / n_bins
        in_bin = [
            [(lo < c <= hi) or (m == 0 and c == 0) for c in conf]
            for m, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))
        ]
        # Right in even bins and wrong in odd ones: neighbouring bins' gaps have opposite signs, so an example
        # in the wrong bin changes the ECE, not only the reliability counts.
        labels = np.array([np.flatnonzero(np.array(in_bin)[:, i])[0] % 2 for i in range(len(conf))])
        metric = classification_metrics(n_bins)["ece"]
        metric.update(torch.from_numpy(probs), torch.from_numpy(labels))
        assert float(metric.compute()) == pytest.approx(reference(probs, labels, n_bins)["ece"], abs=1e-12), n_bins
        assert metric.bins()["count"] == [int(sum(b)) for b in in_bin], n_bins


@pytest.mark.parametrize("margin", [np.inf, 25.0])  # one-hot, or confident enough that nll and brier are ~1e-11
def test_a_confident_first_batch_does_not_tie_nll_to_brier(margin):
    # torchmetrics' compute groups compared the states after the first update with allclose; acc, nll and brier
    # share state names, so a first batch with nll and brier totals both ~0 merged them and nll reported brier.
    rng = np.random.default_rng(3)
    first_labels = np.array([0, 1, 2, 0])
    logits = np.where(np.eye(3)[first_labels] == 1, 0.0, -margin)
    first = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    probs = np.concatenate([first, rng.dirichlet(np.ones(3), 40)])
    labels = np.concatenate([first_labels, rng.integers(0, 3, 40)])
    metrics = classification_metrics()
    metrics.update(torch.from_numpy(probs[:4]), torch.from_numpy(labels[:4]))
    metrics.update(torch.from_numpy(probs[4:]), torch.from_numpy(labels[4:]))
    got, ref = {k: float(v) for k, v in metrics.compute().items()}, reference(probs, labels)
    for key in ("acc", "ece", "nll", "brier"):
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key
