"""Generation from a trained run's adapter (a cloze ARC run of a tiny random LLaMA): each member writes what the
plain LM with that member's weights folded in writes, token for token (transformers' own greedy ``generate``);
the predictive's first step is the mean of those plain LMs' softmaxes; ``sve-generate`` prints and writes the
same answers; methods whose members are not one LM's layers are refused by name."""

import copy
import json

import pytest
import torch

from sve.api.generation import generate
from sve.errors import InputError
from sve.layers.member import member_layers
from sve.runs.reevaluate import load_run
from sve.runs.run import run
from tests.conftest import compose_cfg
from tests.data.test_arc import TINY_CHOICE_LLM, _write_arc

NEW = 6
MEMBERS = 3


def train_arc(root, method: str, *extra: str):
    _write_arc(root / "arc")
    overrides = [
        "dataset=arc_easy",
        f"dataset.root={root / 'arc'}",
        f"method={method}",
        "dataset.scoring=cloze",
        f"ensemble_size={MEMBERS}",
        "dataset.batch_size=4",
        "dataset.max_length=48",
        *extra,
    ]
    run(compose_cfg(TINY_CHOICE_LLM + overrides, root / "run"))
    return root / "run"


@pytest.fixture(scope="module")
def arc_run(tmp_path_factory):
    # sigma_init=0.3: members far apart, so that a mix-up of members would show
    return train_arc(tmp_path_factory.mktemp("run_generation"), "sve", "sigma_init=0.3")


@pytest.fixture(scope="module")
def method(arc_run):
    _, _, module, _ = load_run(arc_run / "adapter", trainer=False)
    return module.method


@pytest.fixture(scope="module")
def prompts(method):
    tokenizer = method.backbone.tokenizer
    texts = ["Question: Which is a planet?\nAnswer:", "Question: Which is a liquid here?\nAnswer:"]
    encoded = [tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, encoded))
    ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded])  # left-padded
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    return ids, mask


def plain_member(method, m: int):
    """The LM with member ``m``'s weights as plain layers (what ``merge`` does for a wrapped model)."""
    memo = {
        id(layer): layer.plain(layer.member_weight(m), layer.member_bias(m))
        for layer in member_layers(method.backbone.model)
    }
    return copy.deepcopy(method.backbone.model, memo).eval()


def test_each_member_writes_as_its_own_plain_lm(method, prompts):
    ids, mask = prompts
    result = generate(method, input_ids=ids, attention_mask=mask, max_new_tokens=NEW)
    plains = [plain_member(method, m) for m in range(MEMBERS)]
    answers = []
    for m, plain in enumerate(plains):
        with torch.no_grad():
            expected = plain.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
        answers.append(expected[:, ids.shape[1] :])
        assert torch.equal(result.member_token_ids[m], answers[-1]), m
    assert len({tuple(a.flatten().tolist()) for a in answers}) > 1  # the members write different answers
    # The predictive's first token: the argmax of the mean of the plain members' softmaxes at the prompt's end.
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        probs = torch.stack(
            [p(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].softmax(-1) for p in plains]
        ).mean(0)
    assert torch.equal(result.token_ids[:, 0], probs.argmax(-1))
    torch.testing.assert_close(
        result.token_scores["log_prob"][:, 0], probs.max(-1).values.log().double(), atol=1e-5, rtol=1e-5
    )
    assert bool((result.scores["mutual_information"] > 0).all())  # members that differ disagree


def test_a_lora_ensemble_run_writes_as_its_members_plain_lms(tmp_path, prompts):
    # LoRA-Ensemble's members are W + (alpha / r) B_m A_m inside the same LM: the same route, other layers.
    _, _, module, _ = load_run(train_arc(tmp_path, "lora_ensemble", "method.lr=0.05") / "adapter", trainer=False)
    ids, mask = prompts
    result = generate(module.method, input_ids=ids, attention_mask=mask, max_new_tokens=NEW)
    for m in range(MEMBERS):
        with torch.no_grad():
            plain = plain_member(module.method, m).generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False
            )
        assert torch.equal(result.member_token_ids[m], plain[:, ids.shape[1] :]), m


def test_one_at_a_time_writes_as_stacked(method, prompts):
    ids, mask = prompts
    stacked = generate(method, input_ids=ids, attention_mask=mask, max_new_tokens=NEW, member_answers=False)
    method.members_at_once = 1
    try:
        alone = generate(method, input_ids=ids, attention_mask=mask, max_new_tokens=NEW, member_answers=False)
    finally:
        method.members_at_once = "auto"
    assert torch.equal(stacked.token_ids, alone.token_ids)
    torch.testing.assert_close(stacked.scores["mutual_information"], alone.scores["mutual_information"])


def test_the_run_tokenizer_reads_text_prompts(method, prompts):
    # A run knows its tokenizer: text prompts need no tokenizer argument, and answers come back as text.
    result = generate(method, ["Question: Which is a planet?\nAnswer:"], max_new_tokens=NEW, member_answers=False)
    assert isinstance(result.texts[0], str) and result.lengths.tolist() == [NEW]


def test_a_run_reads_its_prompts_as_trained_not_through_a_chat_template(method):
    # A run was trained on its data's plain prompts: a tokenizer's chat template is applied only when asked for.
    tokenizer = method.backbone.tokenizer
    question = ["Question: Which is a planet?\nAnswer:"]
    plain = generate(method, question, max_new_tokens=NEW, member_answers=False)
    tokenizer.chat_template = "Q {{ messages[0]['content'] }}!"
    try:
        default = generate(method, question, max_new_tokens=NEW, member_answers=False)
        chatted = generate(method, question, max_new_tokens=NEW, member_answers=False, chat=True)
    finally:
        tokenizer.chat_template = None
    assert torch.equal(default.token_ids, plain.token_ids)
    assert not torch.equal(chatted.scores["sequence_probability"], plain.scores["sequence_probability"])


def test_sve_generate_prints_and_writes_the_answers(arc_run, method, prompts, tmp_path, capsys):
    from sve.cli.generate import generate_from_run as main

    question = "Question: Which is a planet?\nAnswer:"
    out = tmp_path / "answers.jsonl"
    assert main([str(arc_run), f"prompt={question}", f"max_new_tokens={NEW}", f"out={out}"]) == 0
    record = json.loads(out.read_text())
    expected = generate(method, [question], max_new_tokens=NEW)
    assert record["answer"] == expected.texts[0] and record["member_answers"] == [a[0] for a in expected.member_texts]
    assert record["scores"]["mutual_information"] == pytest.approx(float(expected.scores["mutual_information"][0]))
    assert expected.texts[0] in capsys.readouterr().out
    with pytest.raises(InputError, match=r"max_new_tokens='many' is not valid"):
        main([str(arc_run), f"prompt={question}", "max_new_tokens=many"])
    with pytest.raises(InputError, match=r"no prompt: give prompt=<text> or prompts_file=<file>"):
        main([str(arc_run)])
    with pytest.raises(InputError, match=r"meaning='nli:' is not valid; choose one of \['string', 'minilm', 'nli:<"):
        main([str(arc_run), f"prompt={question}", "meaning=nli:"])


def test_members_that_are_not_one_lms_layers_are_refused(method):
    from sve.methods.last_layer import LastLayerEnsemble

    other = copy.copy(method)
    other.__class__ = type("LastLayerLike", (LastLayerEnsemble,), {})
    with pytest.raises(InputError, match=r"LastLayerLike on a run's language model: its members are not"):
        generate(other, ["x"], max_new_tokens=1)


def test_sve_generate_refuses_a_run_that_cannot_write_before_building_it():
    # A committed SST-2 run (a sentence encoder): refused from its config alone, naming its backbone.
    from sve.cli.generate import generate_from_run
    from tests.conftest import ROOT

    encoder_run = ROOT / "results" / "mini" / "runs" / "mini_sst2_minilm" / "sve_top_m4" / "seed0"
    with pytest.raises(InputError, match=r"needs a run whose backbone is a causal LM.*backbone=minilm_l6 \(sve"):
        generate_from_run([str(encoder_run), "prompt=hello"])
