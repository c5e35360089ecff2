"""Selective prediction: the risk-coverage curve and AURC against numpy references written here (a plain sort
without ties; the mean over every order of the tied examples with ties), the compact record of results.json, and
torch-uncertainty's AURC and AUGRC."""

import itertools
import math

import numpy as np
import pytest
import torch

from sve.metrics.selective import aurc, curve_record, risk_coverage, selective_scores


def reference_curve(confidence: np.ndarray, correct: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """The risk at coverage k/N, k = 1..N: the error rate of the first k examples of ``order`` (by default the
    examples by decreasing confidence), counted with a loop."""
    order = np.argsort(-confidence, kind="stable") if order is None else order
    risks, errors = [], 0
    for k, i in enumerate(order, 1):
        errors += not correct[i]
        risks.append(errors / k)
    return np.array(risks)


def every_tie_order(confidence: np.ndarray):
    """Every order of the examples by decreasing confidence, tied examples in every order among themselves."""
    groups = [np.flatnonzero(confidence == c) for c in sorted(set(confidence), reverse=True)]
    for parts in itertools.product(*(itertools.permutations(g) for g in groups)):
        yield np.concatenate(parts)


def test_without_ties_the_curve_is_the_error_rate_of_the_most_confident():
    rng = np.random.default_rng(0)
    confidence, correct = rng.uniform(0.2, 1.0, 500), rng.uniform(size=500) < 0.7
    assert len(set(confidence)) == 500
    coverage, risk = risk_coverage(torch.from_numpy(confidence), torch.from_numpy(correct))
    ref = reference_curve(confidence, correct)
    np.testing.assert_allclose(risk.numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(coverage.numpy(), np.arange(1, 501) / 500)
    assert risk[-1] == pytest.approx(1 - correct.mean(), abs=1e-12)  # all kept: the error rate of the set
    assert aurc(torch.from_numpy(confidence), torch.from_numpy(correct)) == pytest.approx(ref.mean(), abs=1e-12)


def test_ties_count_the_mean_over_every_order_of_the_tied_examples():
    # 9 examples in 4 tie groups (3, 2, 1, 3): 6 * 2 * 1 * 6 = 72 orders, averaged by brute force.
    confidence = np.array([0.9, 0.5, 0.9, 0.7, 0.5, 0.9, 0.6, 0.5, 0.7])
    correct = np.array([1, 0, 0, 1, 1, 1, 0, 0, 0], dtype=bool)
    orders = list(every_tie_order(confidence))
    assert len(orders) == 72
    expected = np.mean([reference_curve(confidence, correct, order) for order in orders], axis=0)
    _, risk = risk_coverage(torch.from_numpy(confidence), torch.from_numpy(correct))
    np.testing.assert_allclose(risk.numpy(), expected, rtol=0, atol=1e-12)
    # Where a coverage keeps whole groups every order gives the same risk: the first group, 1 error in 3.
    assert risk[2] == pytest.approx(1 / 3, abs=1e-15)
    assert aurc(torch.from_numpy(confidence), torch.from_numpy(correct)) == pytest.approx(expected.mean(), abs=1e-12)


def test_the_curve_does_not_depend_on_the_order_of_the_examples():
    rng = np.random.default_rng(1)
    confidence = np.round(rng.uniform(0.3, 1.0, 400), 1)  # eight values: large tie groups
    correct = rng.uniform(size=400) < 0.6
    _, risk = risk_coverage(torch.from_numpy(confidence), torch.from_numpy(correct))
    for seed in range(3):
        shuffled = np.random.default_rng(seed).permutation(400)
        _, again = risk_coverage(torch.from_numpy(confidence[shuffled]), torch.from_numpy(correct[shuffled]))
        assert torch.equal(risk, again)  # bit for bit: a tie group's examples count the same share
    # A sort that keeps the data order within ties would give another curve here; the expectation lies between
    # the tie order that puts the errors first and the one that puts them last.
    first = reference_curve(confidence, correct, np.lexsort((correct, -confidence)))
    last = reference_curve(confidence, correct, np.lexsort((~correct, -confidence)))
    assert (first + 1e-12 >= risk.numpy()).all() and (risk.numpy() >= last - 1e-12).all()


def test_perfect_and_worst_confidence():
    correct = torch.tensor([True] * 6 + [False] * 4)
    perfect = torch.tensor([1.0] * 6 + [0.5] * 4)  # every right answer more confident than every wrong one
    _, risk = risk_coverage(perfect, correct)
    np.testing.assert_allclose(risk.numpy(), [0] * 6 + [k / (6 + k) for k in range(1, 5)], atol=1e-15)
    _, risk = risk_coverage(1 - perfect, correct)
    np.testing.assert_allclose(risk.numpy(), [1] * 4 + [4 / k for k in range(5, 11)], atol=1e-15)
    _, risk = risk_coverage(torch.full((10,), 0.7), correct)  # one tie group: the error rate everywhere
    np.testing.assert_allclose(risk.numpy(), np.full(10, 0.4), atol=1e-15)


def test_refusals():
    with pytest.raises(ValueError, match="at least one"):
        risk_coverage(torch.zeros(0), torch.zeros(0, dtype=torch.bool))
    with pytest.raises(ValueError, match="one confidence per prediction"):
        risk_coverage(torch.zeros(3), torch.zeros(4, dtype=torch.bool))
    with pytest.raises(FloatingPointError, match="1 NaN"):
        risk_coverage(torch.tensor([0.5, float("nan")]), torch.tensor([True, False]))


@pytest.mark.parametrize("n", [1, 37, 100, 250, 1001])
def test_the_record_keeps_exact_points_up_to_coverage_one(n):
    rng = np.random.default_rng(n)
    confidence, correct = rng.uniform(size=n), rng.uniform(size=n) < 0.5
    coverage, risk = risk_coverage(torch.from_numpy(confidence), torch.from_numpy(correct))
    record = curve_record(coverage, risk)
    kept = sorted({math.ceil(j * n / 100) for j in range(1, 101)})  # k of the coverages k/N kept
    assert record["coverage"] == pytest.approx([k / n for k in kept], abs=1e-15)
    assert record["risk"] == pytest.approx(reference_curve(confidence, correct)[np.array(kept) - 1], abs=1e-12)
    assert len(record["coverage"]) == min(n, 100) and record["coverage"][-1] == 1.0


def test_selective_scores_read_the_predictives_first_maximum():
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.ones(5), 300)
    probs[:20] = 0.2  # every class tied: the prediction is class 0, as the accuracy counts it
    labels = rng.integers(0, 5, 300)
    got = selective_scores(torch.from_numpy(probs), torch.from_numpy(labels))
    confidence, correct = probs.max(1), probs.argmax(1) == labels
    expected = np.mean([reference_curve(confidence, correct, o) for o in cyclic_tie_orders(confidence)], 0)
    assert got["aurc"] == pytest.approx(expected.mean(), abs=1e-12)
    assert got["risk_coverage"]["risk"][-1] == pytest.approx(1 - correct.mean(), abs=1e-12)


def cyclic_tie_orders(confidence: np.ndarray):
    """The orders of the test above, whose one tie group (20 examples, 20! orders) is the least confident: the
    mean over every order is the mean over the group's cyclic shifts, in which each example takes each place
    once (the expected errors among the first k are a sum over places)."""
    tied = np.flatnonzero(confidence == confidence[0])
    rest = np.argsort(-confidence, kind="stable")
    rest = rest[~np.isin(rest, tied)]
    ahead = rest[confidence[rest] > confidence[0]]
    behind = rest[confidence[rest] < confidence[0]]
    for shift in range(len(tied)):
        yield np.concatenate([ahead, np.roll(tied, shift), behind])


def test_torch_uncertainty_integrates_the_same_points_with_the_trapezoid():
    """torch-uncertainty's AURC = trapezoid over the coverages 1/N..1, rescaled by 1 / (1 - 1/N): this AURC
    plus (mean r - (r_1 + r_N) / 2) / (N - 1), as the module docstring says (computed here with numpy)."""
    rng = np.random.default_rng(3)
    confidence, correct = rng.uniform(size=300), rng.uniform(size=300) < 0.8
    ours = aurc(torch.from_numpy(confidence), torch.from_numpy(correct))
    risk, n = reference_curve(confidence, correct), 300
    trapezoid = np.sum((risk[1:] + risk[:-1]) / 2) / n / (1 - 1 / n)
    assert trapezoid == pytest.approx(ours + (risk.mean() - (risk[0] + risk[-1]) / 2) / (n - 1), abs=1e-12)


def test_against_torch_uncertainty():
    from torch_uncertainty import metrics  # a test dependency (pyproject.toml's dev extra)

    rng = np.random.default_rng(4)
    probs = torch.from_numpy(rng.dirichlet(np.ones(4), 300))  # distinct confidences: its sort order is ours
    labels = torch.from_numpy(rng.integers(0, 4, 300))
    theirs = metrics.AURC()
    theirs.update(probs, labels)
    confidence, predicted = probs.max(-1)
    risk = risk_coverage(confidence, predicted == labels)[1].numpy()
    expected = aurc(confidence, predicted == labels) + (risk.mean() - (risk[0] + risk[-1]) / 2) / (len(risk) - 1)
    assert float(theirs.compute()) == pytest.approx(expected, abs=1e-6)


def test_augrc_against_torch_uncertainty():
    """torch-uncertainty's AUGRC is the trapezoid over the coverages 1/N..1 of the generalized risk g = c r,
    rescaled by 1 / (1 - 1/N): ours (the mean of g) plus (mean g - (g_1 + g_N) / 2) / (N - 1)."""
    from torch_uncertainty import metrics

    rng = np.random.default_rng(5)
    probs = torch.from_numpy(rng.dirichlet(np.ones(4), 300))
    labels = torch.from_numpy(rng.integers(0, 4, 300))
    theirs = metrics.AUGRC()
    theirs.update(probs, labels)
    got = selective_scores(probs, labels)
    confidence, predicted = probs.max(-1)
    coverage, risk = risk_coverage(confidence, predicted == labels)
    g = (coverage * risk).numpy()
    assert got["augrc"] == pytest.approx(g.mean(), abs=1e-15)
    assert float(theirs.compute()) == pytest.approx(got["augrc"] + (g.mean() - (g[0] + g[-1]) / 2) / 299, abs=1e-6)


def test_augrc_by_hand():
    """Three examples by falling confidence, right, wrong, right: errors among the first k are 0, 1, 1, so the
    generalized risks are 0, 1/3, 1/3 and their mean 2/9."""
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.4, 0.6]], dtype=torch.float64)
    assert selective_scores(probs, torch.tensor([0, 0, 1]))["augrc"] == pytest.approx(2 / 9, abs=1e-15)
