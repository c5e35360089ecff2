"""Split conformal sets (``sve.metrics.conformal``): the guarantee measured over random calibration/test splits of a
committed run's real test predictions, against the exact law of the covered count (and a shifted threshold fails
the same check); thresholds and sets against torch-uncertainty's and MAPIE's; the disagreement score's sets against
thr's at equal coverage."""

import numpy as np
import pytest
import torch
from scipy import stats

from sve.metrics import conformal
from sve.runs.prediction_files import read_predictive
from tests.conftest import ROOT

# A deep ensemble (M = 4) of EfficientNet-Lite0 on 1,000 CIFAR-10 test images: 73% accurate, so sets are not trivial.
RUN = ROOT / "results/mini/runs/mini_cifar10_effnet/deep_ensemble_m4/seed0/predictive/test.npz"
SPLITS = 400


def real_predictions():
    examples = read_predictive(RUN, "test")
    probs = torch.from_numpy(examples.arrays["probs"]).double()
    return probs / probs.sum(-1, keepdim=True), torch.from_numpy(examples.labels)  # float32 rows sum to 1 +- 1e-7


def coverage_band_check(scores: torch.Tensor, alpha: float, fit=conformal.threshold, splits: int = SPLITS) -> float:
    """Mean test coverage over random halves of the examples, asserted within 4.5 standard errors of its exact
    expectation. With distinct scores the covered count of m test examples is beta-binomial(m, k, n + 1 - k),
    k = ceil((n + 1)(1 - alpha)), whatever the data (only the scores' ranks matter, and a random split orders
    them uniformly): the binomial band of 1 - alpha widened by the calibration set's own chance."""
    n = len(scores) // 2
    m = len(scores) - n
    k = conformal.rank(n, alpha)
    law = stats.betabinom(m, k, n + 1 - k)
    rng = np.random.default_rng(0)
    covered = []
    for _ in range(splits):
        order = torch.from_numpy(rng.permutation(len(scores)))
        q = fit(scores[order[:n]], alpha)
        covered.append(int((scores[order[n:]] <= q).sum()))
    mean, error = np.mean(covered), law.std() / np.sqrt(splits)
    assert abs(mean - law.mean()) < 4.5 * error, (mean / m, law.mean() / m, error / m)
    assert law.mean() / m >= 1 - alpha
    return mean / m


@pytest.mark.parametrize("score", ["thr", "aps", "raps"])
@pytest.mark.parametrize("alpha", [0.1, 0.05])
def test_coverage_over_random_splits_of_real_predictions_is_the_guaranteed_one(score, alpha):
    probs, labels = real_predictions()
    scores = conformal.label_scores(probs, labels, score)
    assert len(torch.unique(scores)) == len(scores)  # distinct: the law above is exact
    coverage_band_check(scores, alpha)


def test_a_threshold_five_ranks_lower_fails_the_band():
    """The check can fail: the threshold five ranks below the finite-sample one covers about 5 / (n + 1) less, a
    point of coverage, which 400 splits resolve (4.5 standard errors are 0.4 points here)."""
    probs, labels = real_predictions()
    scores = conformal.label_scores(probs, labels, "thr")

    def lower(cal, alpha):
        return float(cal.sort().values[conformal.rank(len(cal), alpha) - 6])

    coverage_band_check(scores, 0.1)
    with pytest.raises(AssertionError):
        coverage_band_check(scores, 0.1, fit=lower)


def test_the_threshold_is_the_ceil_rank_order_statistic():
    scores = torch.arange(1, 100, dtype=torch.float64)  # n = 99
    assert conformal.threshold(scores, 0.1) == 90  # (n + 1)(1 - alpha) = 90 exactly, though 1 - 0.1 != 0.9
    assert conformal.threshold(scores[:19], 0.05) == 19  # k = n: the largest score
    assert conformal.threshold(scores[:18], 0.05) == float("inf")  # k = 19 > n: every class


def test_scores_by_hand():
    probs = torch.tensor([[0.5, 0.2, 0.3]], dtype=torch.float64)
    torch.testing.assert_close(conformal.class_scores(probs, "lac"), torch.tensor([[0.5, 0.8, 0.7]]).double())
    torch.testing.assert_close(conformal.class_scores(probs, "aps"), torch.tensor([[0.5, 1.0, 0.8]]).double())
    raps = conformal.class_scores(probs, "raps", k_reg=1, lam=0.25)  # ranks 1, 3, 2 pay 0, 0.5, 0.25
    torch.testing.assert_close(raps, torch.tensor([[0.5, 1.5, 1.05]]).double())
    mi = torch.tensor([0.4], dtype=torch.float64)
    torch.testing.assert_close(conformal.class_scores(probs, "thr_mi", mi, beta=0.1), 2 * (1 - probs))


@pytest.mark.parametrize("score", ["thr", "aps", "raps"])
def test_thresholds_and_sets_match_torch_uncertainty(score):
    """torch-uncertainty 0.13's conformal classifiers, not randomised, on the real predictions. Its threshold is
    torch.quantile's interpolated (1 - alpha) quantile; at the level (k - 1) / (n - 1) that is the k-th smallest
    score exactly, so its fit gives our threshold through its own scores. Its sets are ours, except that its THR
    always adds the top class and its APS and RAPS add the lowest-score class to an empty set."""
    from torch_uncertainty.post_processing.conformal import ConformalClsAPS, ConformalClsRAPS, ConformalClsTHR

    probs, labels = real_predictions()
    cal, test = slice(0, 500), slice(500, None)
    theirs = {
        "thr": lambda level: ConformalClsTHR(level, torch.nn.Identity(), enable_ts=False),
        "aps": lambda level: ConformalClsAPS(level, torch.nn.Identity(), randomized=False, enable_ts=False),
        "raps": lambda level: ConformalClsRAPS(
            level, torch.nn.Identity(), randomized=False, penalty=0.05, regularization_rank=2, enable_ts=False
        ),
    }[score]
    options = {"lam": 0.05, "k_reg": 2}
    for alpha in (0.1, 0.05):
        k = conformal.rank(500, alpha)
        ours = conformal.threshold(conformal.label_scores(probs[cal], labels[cal], score, **options), alpha)
        reference = theirs(1 - (k - 1) / 499)
        reference.fit([(probs[cal].log(), labels[cal])])  # softmax(log p) = p through their Identity "model"
        assert float(reference.q_hat) == pytest.approx(ours, abs=1e-8)  # cumulative sums in another order
        reference.q_hat = torch.tensor(ours, dtype=torch.float64)
        their_sets = reference.conformal(probs[test].log()) > 0
        sets = conformal.prediction_sets(probs[test], ours, score, **options)
        if score == "thr":
            sets[torch.arange(500), probs[test].argmax(-1)] = True
        else:
            empty = ~sets.any(-1)
            lowest = conformal.class_scores(probs[test][empty], score, **options).argmin(-1)
            sets[empty.nonzero().squeeze(-1), lowest] = True
        assert torch.equal(their_sets, sets)


def test_lac_thresholds_and_sets_match_mapie_and_its_quantile_matches_for_aps_and_raps():
    """MAPIE 1.6's split conformal classifier (LAC) on a fixed predictor of the real predictions: the same
    thresholds and sets at both levels. Its APS and RAPS randomise their scores (and RAPS tunes its own k_reg and
    lambda), so for those its finite-sample quantile is checked on our scores."""
    from mapie.classification import SplitConformalClassifier
    from mapie.utils import _compute_classification_quantile
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Fixed(ClassifierMixin, BaseEstimator):
        """A prefitted classifier whose input is the row of the predictions to give."""

        def fit(self, x, y):
            return self

        def predict_proba(self, x):
            return probs.numpy()[np.asarray(x)[:, 0].astype(int)]

        def predict(self, x):
            return self.predict_proba(x).argmax(-1)

    probs, labels = real_predictions()
    estimator = Fixed()
    estimator.classes_, estimator.n_features_in_ = np.arange(10), 1
    mapie = SplitConformalClassifier(estimator, confidence_level=[0.9, 0.95], conformity_score="lac", prefit=True)
    mapie.conformalize(np.arange(600)[:, None], labels[:600].numpy())
    _, their_sets = mapie.predict_set(np.arange(600, 1000)[:, None])
    for i, alpha in enumerate((0.1, 0.05)):
        q = conformal.threshold(conformal.label_scores(probs[:600], labels[:600], "thr"), alpha)
        assert mapie._mapie_classifier.conformity_score_function_.quantiles_[i] == pytest.approx(q, abs=1e-12)
        np.testing.assert_array_equal(their_sets[:, :, i], conformal.prediction_sets(probs[600:], q, "thr").numpy())
    for score in ("aps", "raps"):
        scores = conformal.label_scores(probs[:600], labels[:600], score)
        quantiles = _compute_classification_quantile(scores.numpy(), np.array([0.1, 0.05]))
        np.testing.assert_array_equal(quantiles, [conformal.threshold(scores, a) for a in (0.1, 0.05)])


def disagreeing_ensemble(n: int, seed: int):
    """Members of 10 classes that agree on half the examples, on which the predictive is right as often as it is
    confident, and disagree on the other half, on which the label is often none of the members' favourites (the
    members are each confident of their own class): the case where disagreement says more than the predictive."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    hard = torch.rand(n, generator=g) < 0.5
    logits = torch.randn(4, n, 10, generator=g)
    logits[:, torch.arange(n), labels] += 3.0  # the agreeing members lean to the label together
    favourites = torch.randint(0, 10, (4, n), generator=g)  # the disagreeing ones each to a class of its own
    spread = torch.zeros(4, n, 10).scatter_(-1, favourites[..., None], 6.0)
    logits = torch.where(hard[None, :, None], torch.randn(4, n, 10, generator=g) + spread, logits)
    member = logits.double().softmax(-1)
    probs = member.mean(0)
    mi = -(probs * probs.log()).sum(-1) + (member * member.log()).sum(-1).mean(0)
    return probs, labels, mi, hard


def test_the_disagreement_score_gives_smaller_sets_at_the_same_guarantee_where_members_disagree_informatively():
    """Measured on a constructed ensemble (no committed run keeps its member predictions): thr_mi covers as
    guaranteed, its sets are larger where the members disagree and smaller where they agree, and its mean set is
    smaller than thr's at the same alpha. This is a property of the data, not a theorem: where disagreement says
    nothing about the errors it need not win."""
    probs, labels, mi, hard = disagreeing_ensemble(4000, 0)
    test = disagreeing_ensemble(4000, 1)
    record = conformal.record((probs, labels, mi), test[:3], "synthetic calibration", "synthetic test", beta=0.1)
    for alpha in ("0.1", "0.05"):
        thr, thr_mi = record["by_alpha"][alpha]["thr"], record["by_alpha"][alpha]["thr_mi"]
        for found in (thr, thr_mi):
            assert found["coverage"] >= 1 - float(alpha) - 0.01
        assert thr_mi["mean_size"] < 0.9 * thr["mean_size"], (thr_mi["mean_size"], thr["mean_size"])
    q = conformal.threshold(conformal.label_scores(probs, labels, "thr_mi", mi), 0.1)
    sizes = conformal.prediction_sets(test[0], q, "thr_mi", test[2]).sum(-1).double()
    assert sizes[test[3]].mean() > sizes[~test[3]].mean()


def test_set_metrics_by_hand():
    sets = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    got = conformal.set_metrics(sets, torch.tensor([0, 2, 2, 1]))
    assert got["coverage"] == 0.75 and got["mean_size"] == 2.0 and got["median_size"] == 2.0
    assert got["size_stratified"] == {"size": [1, 2, 3], "count": [1, 2, 1], "coverage": [1.0, 0.5, 1.0]}
    assert got["class_conditional"] == {"count": [1, 1, 2], "coverage": [1.0, 1.0, 0.5]}
    assert conformal.set_metrics(sets[:2], torch.tensor([0, 0]))["class_conditional"]["coverage"] == [1.0, None, None]
