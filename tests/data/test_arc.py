"""ARC-Easy as multiple choice for a causal LM: prompts, 3-5 options, digit labels, letter-logit heads."""

import json
import warnings

import pytest
import torch

from sve.backbones.choice_lm import letter_token_ids
from sve.data import ARCEasyData
from sve.data.arc import to_example
from sve.errors import InputError
from sve.layers.recompute import enable_checkpointing
from sve.methods.sve import SVE
from sve.runs.run import instantiate, run
from tests.conftest import compose_cfg, shared_path

QUESTIONS = [  # 3, 4 and 5 options; letter and digit labels
    {
        "id": "q3",
        "question": "Which is a liquid?",
        "choices": {"text": ["ice", "water", "steam"], "label": ["1", "2", "3"]},
        "answerKey": "2",
    },
    {
        "id": "q4",
        "question": "Which is a planet?",
        "choices": {"text": ["sun", "moon", "mars", "comet"], "label": ["A", "B", "C", "D"]},
        "answerKey": "C",
    },
    {
        "id": "q5",
        "question": "Which is a mammal?",
        "choices": {"text": ["cod", "bee", "ant", "owl", "bat"], "label": ["1", "2", "3", "4", "5"]},
        "answerKey": "5",
    },
]
TINY_CHOICE_LLM = [
    "backbone=tiny_llama",
    "+backbone.answer_tokens=null",
    "backbone._target_=sve.backbones.ChoiceCausalLMBackbone",
]


def _write_arc(root, copies=4, subset="ARC-Easy"):
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        rows = [dict(q, id=f"{q['id']}_{i}") for i in range(copies) for q in QUESTIONS]
        (root / f"{subset}-{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_arc_challenge_reads_its_own_local_files(tmp_path):
    _write_arc(tmp_path / "challenge", copies=2, subset="ARC-Challenge")
    cfg = compose_cfg(TINY_CHOICE_LLM + ["dataset=arc_challenge", f"dataset.root={tmp_path / 'challenge'}"])
    datamodule = instantiate(cfg.dataset)
    datamodule.attach(instantiate(cfg.backbone))
    datamodule.setup()
    assert cfg.dataset.name == "arc_challenge" and len(datamodule.splits["test"]) == 2 * len(QUESTIONS)
    with pytest.raises(InputError, match=r"ARC-Challenge-train.jsonl.*hub_config='ARC-Challenge'"):
        easy_only = compose_cfg(TINY_CHOICE_LLM + ["dataset=arc_challenge", f"dataset.root={tmp_path}"])
        _write_arc(tmp_path, copies=1)  # ARC-Easy files only
        instantiate(easy_only.dataset).setup()


def test_prompt_letters_and_digit_labels():
    prompt, label, count, stem, options = to_example(QUESTIONS[0])
    assert prompt == "Question: Which is a liquid?\nA. ice\nB. water\nC. steam\nAnswer:"
    assert (label, count) == (1, 3)
    assert stem == "Question: Which is a liquid?\nAnswer:" and options == ("ice", "water", "steam")  # cloze form
    assert to_example(QUESTIONS[1])[1:3] == (2, 4) and to_example(QUESTIONS[2])[1:3] == (4, 5)
    with pytest.raises(ValueError, match="answerKey"):
        to_example(dict(QUESTIONS[1], answerKey="E"))


def test_local_jsonl_and_choice_mask(tmp_path):
    _write_arc(tmp_path)
    backbone = instantiate(compose_cfg(TINY_CHOICE_LLM).backbone)
    data = ARCEasyData(root=str(tmp_path), batch_size=3)
    data.attach(backbone)
    assert backbone.answer_tokens == ["A", "B", "C", "D", "E"]  # the dataset declares its answer letters
    splits = data.load_splits()
    assert [len(splits[s]) for s in ("train", "val", "test")] == [12, 12, 12]
    batch = data.collate(splits["test"][:3])
    assert batch["choice_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [1, 2, 4]


def test_missing_files_error_names_key_and_layout(tmp_path):
    with pytest.raises(InputError, match=r"arc_easy.*dataset.root.*ARC-Easy-\{train,validation,test\}.jsonl"):
        ARCEasyData(root=str(tmp_path)).load_splits()


def test_member_logits_are_the_lm_letter_logits_at_init(tmp_path):
    """Prediction = softmax over the option-letter logits at the answer position; absent options get -inf."""
    _write_arc(tmp_path, copies=1)
    backbone = instantiate(compose_cfg(TINY_CHOICE_LLM).backbone)
    data = ARCEasyData(root=str(tmp_path), batch_size=3)
    data.attach(backbone)
    batch = data.collate(data.load_splits()["test"])
    lm = backbone.model
    with torch.no_grad():
        lm_logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        last = batch["attention_mask"].sum(1) - 1
        ids = letter_token_ids(backbone.tokenizer, list("ABCDE"))
        expected = lm_logits[torch.arange(3), last][:, ids]  # (B, 5)
        method = SVE(backbone, ensemble_size=2, num_classes=5, sigma_init=0.0).eval()
        member_logits = method(batch)  # (M, B, C)
    assert member_logits.shape == (2, 3, 5)
    mask = batch["choice_mask"]
    for m in range(2):
        torch.testing.assert_close(member_logits[m][mask], expected[mask], atol=1e-4, rtol=1e-4)
    assert torch.isinf(member_logits[:, ~mask]).all()
    assert torch.allclose(member_logits.softmax(-1)[:, ~mask], torch.zeros(1))


def test_cloze_member_logits_are_option_log_likelihoods_at_init(tmp_path):
    """Cloze: member logits = mean log-probability of each option's tokens after the stem, computed here one
    unpadded sequence at a time straight from the LM; absent options get -inf."""
    _write_arc(tmp_path, copies=1)
    backbone = instantiate(compose_cfg(TINY_CHOICE_LLM).backbone)
    data = ARCEasyData(root=str(tmp_path), batch_size=3, scoring="cloze")
    data.attach(backbone)
    examples = data.load_splits()["test"]
    batch = data.collate(examples)
    assert batch["option_ids"].shape[:2] == (3, 5) and backbone.feature_dim == 5
    tok, lm = backbone.tokenizer, backbone.model
    expected = torch.zeros(3, 5)
    with torch.no_grad():
        for b, (_, _, count, stem, options) in enumerate(examples):
            context = tok(stem)["input_ids"]
            for c in range(count):
                option = tok(" " + options[c], add_special_tokens=False)["input_ids"]
                logits = lm(input_ids=torch.tensor([context + option])).logits[0].log_softmax(-1)
                expected[b, c] = sum(logits[len(context) + i - 1, t] for i, t in enumerate(option)) / len(option)
        method = SVE(backbone, ensemble_size=2, num_classes=5, sigma_init=0.0).eval()
        with warnings.catch_warnings():  # transformers' current names: past_key_values goes in 5.40, and more in v6
            warnings.simplefilter("error", FutureWarning)
            member_logits = method(batch)
            enable_checkpointing(backbone.model)
            method.train()  # checkpointed training runs each option as one full sequence
            full_sequences = method(batch)
    mask = batch["choice_mask"]
    assert member_logits.shape == (2, 3, 5) and torch.isinf(member_logits[:, ~mask]).all()
    for logits in (*member_logits, *full_sequences):
        torch.testing.assert_close(logits[mask], expected[mask], atol=1e-4, rtol=1e-4)
    assert method.head_init.startswith("pretrained")  # the identity head: logits are the scores


def test_cloze_needs_a_scoring_backbone_and_a_known_mode(tmp_path):
    with pytest.raises(ValueError, match=r"dataset.scoring='vote' is not valid; choose one of \['letters', 'cloze'\]"):
        ARCEasyData(root=str(tmp_path), scoring="vote")
    plain = instantiate(compose_cfg(["backbone=tiny_llama"]).backbone)  # no option scoring
    with pytest.raises(ValueError, match="dataset.scoring=cloze needs a causal-LM backbone"):
        ARCEasyData(root=str(tmp_path), scoring="cloze").attach(plain)


@pytest.mark.parametrize("method", ["sve", "lora_ensemble"])
def test_cloze_training_run_on_fake_arc(method, tmp_path):
    _write_arc(tmp_path / "arc")
    cfg = compose_cfg(
        TINY_CHOICE_LLM
        + [
            "dataset=arc_easy",
            f"dataset.root={tmp_path / 'arc'}",
            f"method={method}",
            "dataset.scoring=cloze",
            "ensemble_size=2",
            "dataset.batch_size=4",
        ],
        tmp_path / "out",
    )
    results = run(cfg)
    assert results["num_members"] == 2 and 0 <= results["metrics"]["test/acc"] <= 1
    assert results["method_report"]["fell_back_to_one_member_at_a_time"] is None  # the member layout holds


def test_initial_head_only_when_letters_match_classes():
    backbone = instantiate(compose_cfg(TINY_CHOICE_LLM).backbone)
    assert backbone.initial_head("arc_easy", 5) is None  # no dataset has declared answer letters
    backbone.answer_tokens = list("ABCDE")
    assert backbone.initial_head("arc_easy", 2) is None and backbone.initial_head("arc_easy", 5)[0].shape == (5, 32)


def test_training_run_on_fake_arc(tmp_path):
    _write_arc(tmp_path / "arc")
    cfg = compose_cfg(
        TINY_CHOICE_LLM
        + [
            "dataset=arc_easy",
            f"dataset.root={tmp_path / 'arc'}",
            "method=sve",
            "ensemble_size=2",
            "dataset.batch_size=4",
        ],
        tmp_path / "out",
    )
    results = run(cfg)
    assert 0 <= results["metrics"]["test/acc"] <= 1 and results["dataset"] == "arc_easy"


def test_real_arc_easy_splits_parse():
    root = shared_path("data", "arc_easy")
    splits = ARCEasyData(root=str(root)).load_splits()
    assert [len(splits[s]) for s in ("train", "val", "test")] == [2251, 570, 2376]  # Table 8
    for split in splits.values():
        assert all(
            2 < count <= 5 and 0 <= label < count and len(options) == count for _, label, count, _, options in split
        )
        assert {e[2] for e in split} >= {4, 5}


def test_failed_hub_download_names_key_and_layout(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(InputError, match=r"arc_easy.*allenai/ai2_arc.*dataset\.root.*ARC-Easy-"):
        ARCEasyData(root=None).load_splits()


def test_a_cloze_run_evaluated_on_arc_challenge_keeps_its_scoring(tmp_path, caplog):
    # sve-eval dataset=arc_challenge on a run of experiment=mini_arc_smollm2 must keep the run's cloze scoring: the
    # option's default (a letter head) does not match the checkpoint ("written by another model ... heads.weight").
    import logging

    from sve.runs.reevaluate import evaluate_run

    _write_arc(tmp_path / "easy")
    _write_arc(tmp_path / "challenge", copies=2, subset="ARC-Challenge")
    run_dir = tmp_path / "run"
    run(
        compose_cfg(
            TINY_CHOICE_LLM
            + [
                "dataset=arc_easy",
                f"dataset.root={tmp_path / 'easy'}",
                "method=sve",
                "dataset.scoring=cloze",
                "ensemble_size=2",
                "dataset.batch_size=4",
                "dataset.max_length=64",
                "callbacks=default",
            ],
            run_dir,
        )
    )
    challenge = ["dataset=arc_challenge", f"dataset.root={tmp_path / 'challenge'}"]
    with caplog.at_level(logging.WARNING, logger="sve.runs.reevaluate"):
        record = evaluate_run(run_dir, challenge)
    assert record["dataset"] == "arc_challenge" and record["metrics"]["test/examples"] == 2  # 2 debug batches of 1
    evaluated = record["config"]["dataset"]  # the option's own values but the one that shapes the model
    # The run's scoring and its max_length (64, not the option's 512): the shifted questions are read as the
    # run read its own.
    assert (evaluated["scoring"], evaluated["max_length"], evaluated["hub_config"]) == ("cloze", 64, "ARC-Challenge")
    assert [r.getMessage() for r in caplog.records if "keeps" in r.getMessage()] == [
        "dataset=arc_challenge keeps the run's dataset.scoring=cloze, dataset.max_length=64: "
        "it shapes the trained model"
    ]
    # What the command line gives wins; the checkpoint then refuses the model, naming the key that differs.
    with pytest.raises(InputError, match=r"does not fit the model .* dataset.scoring=letters \(trained with cloze\)"):
        evaluate_run(run_dir, [*challenge, "dataset.scoring=letters"])


def test_an_arc_easy_run_reports_arc_challenge_beside_its_test_set(tmp_path):
    # +shifted=arc_challenge: the shifted set is read as the run reads its own questions (cloze, the run's
    # max_length, whatever the option's own values), scored with the run's own temperature, and drawn.
    import numpy as np
    from sklearn.metrics import accuracy_score, log_loss

    from sve.runs.prediction_files import read_predictions

    _write_arc(tmp_path / "easy")
    _write_arc(tmp_path / "challenge", copies=2, subset="ARC-Challenge")
    out = tmp_path / "run"
    cfg = compose_cfg(
        TINY_CHOICE_LLM
        + [
            "dataset=arc_easy",
            f"dataset.root={tmp_path / 'easy'}",
            "method=sve",
            "dataset.scoring=cloze",
            "dataset.max_length=48",
            "ensemble_size=2",
            "dataset.batch_size=4",
            "+shifted=arc_challenge",
            f"dataset.shifted.arc_challenge.root={tmp_path / 'challenge'}",
        ],
        out,
    )
    datamodule = instantiate(cfg.dataset)
    assert datamodule.evaluation_sets() == ["val", "test", "shifted/arc_challenge"]
    datamodule.attach(instantiate(cfg.backbone))
    challenge = datamodule.shifted["arc_challenge"]
    assert (challenge.scoring, challenge.max_length, challenge.key) == ("cloze", 48, "dataset.shifted.arc_challenge")
    results = run(cfg)
    record = results["shifted"]
    assert (
        list(record["sets"]) == ["test", "arc_challenge"]
        and record["temperature_fitted_on"] == "run (in-distribution validation)"
    )
    assert record["temperature"] == results["metrics"]["test/temperature"]  # the run's own, not refitted
    test = record["sets"]["test"]
    assert test["acc"] == results["metrics"]["test/acc"] and test["nll"] == results["metrics"]["test/nll"]
    # The shifted set's numbers against sklearn, from its saved member logits.
    saved = read_predictions(out / results["predictions"]["shifted/arc_challenge"])
    logits, labels = torch.from_numpy(saved["member_logits"]).double(), saved["labels"]
    probs = logits.softmax(-1).mean(0).numpy()
    shifted = record["sets"]["arc_challenge"]
    assert shifted["examples"] == len(labels) == 2 * len(QUESTIONS)
    assert shifted["acc"] == pytest.approx(accuracy_score(labels, probs.argmax(1)))
    assert shifted["nll"] == pytest.approx(log_loss(labels, probs, labels=range(probs.shape[1])), rel=1e-5)
    scaled = torch.log_softmax(torch.from_numpy(np.log(probs)) / record["temperature"], -1).exp().numpy()
    assert shifted["ts_nll"] == pytest.approx(log_loss(labels, scaled, labels=range(probs.shape[1])), rel=1e-4)
    assert (out / "shifted.png").stat().st_size > 0
