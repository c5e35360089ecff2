"""Ensemble.generate on a tiny random LLaMA: at one member it is transformers' greedy decoding token for token;
its predictive at every step is the mean of the members' softmaxes, each member run alone as a plain model
(``merge``, no key/value cache); its scores are the sums and means they are defined as; it stops where it is
told; and MSP and mean token entropy agree with LM-Polygraph's estimators on the same generation."""

import copy
import importlib.util
import math
import sys
import types

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import sve
from sve.backbones.tokenizers import char_tokenizer
from sve.errors import InputError

NEW = 8


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=141,  # the offline character tokenizer's
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def prompts():
    ids = torch.randint(5, 141, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0  # the second prompt is two tokens shorter, left-padded
    return ids, mask


def wrapped(llama, method="sve", **options):
    torch.manual_seed(2)
    return sve.wrap(copy.deepcopy(llama), method=method, pooling="last", **options)


def greedy(model, ids, mask, new=NEW):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    return out[:, ids.shape[1] :]


@pytest.mark.parametrize("method", ["sve", "single"])
def test_one_member_at_init_is_transformers_greedy_token_for_token(llama, prompts, method):
    ids, mask = prompts
    options = {"sigma_init": 0.0} if method == "sve" else {}
    ensemble = wrapped(llama, method, ensemble_size=1, **options)
    result = ensemble.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW)
    assert torch.equal(result.token_ids, greedy(llama, ids, mask))
    assert result.scores["mutual_information"].abs().max() < 1e-12 and result.scores["disagreement"].eq(0).all()


def member_log_probs(members, ids, mask, answer, t):
    """(M, B, V) each member's next-token log-probabilities after ``answer[:, :t]``, the full sequence run again."""
    full, full_mask = torch.cat([ids, answer[:, :t]], 1), torch.cat([mask, torch.ones_like(answer[:, :t])], 1)
    positions = (full_mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        return (
            torch.stack(
                [m(input_ids=full, attention_mask=full_mask, position_ids=positions).logits[:, -1] for m in members]
            )
            .double()
            .log_softmax(-1)
        )


def test_the_predictive_at_each_step_is_the_mean_of_the_members_run_alone(llama, prompts):
    ids, mask = prompts
    ensemble = wrapped(llama, ensemble_size=3, sigma_init=0.05)
    result = ensemble.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW)
    members = [ensemble.merge(member=m).eval() for m in range(3)]  # plain LLaMAs: member m's weights and head
    answer, log_prob, information = result.token_ids, [], []
    for t in range(NEW):
        alone = member_log_probs(members, ids, mask, answer, t)  # (M, B, V)
        predictive = alone.exp().mean(0)  # (B, V): the mean of the members' softmaxes
        assert torch.equal(predictive.argmax(-1), answer[:, t])  # greedy from the predictive
        log_prob.append(predictive.gather(1, answer[:, t, None]).squeeze(1).log())
        entropy = lambda p: -(p * p.log()).sum(-1)  # noqa: E731
        information.append(entropy(predictive) - entropy(alone.exp()).mean(0))
    log_prob, information = torch.stack(log_prob, 1), torch.stack(information, 1)
    torch.testing.assert_close(result.token_scores["log_prob"], log_prob, rtol=0, atol=1e-5)
    torch.testing.assert_close(result.token_scores["mutual_information"], information, rtol=0, atol=1e-6)
    # The sequence probability is the product of the chosen tokens' predictive probabilities.
    torch.testing.assert_close(result.scores["sequence_probability"], log_prob.sum(1).exp(), rtol=1e-4, atol=0)
    torch.testing.assert_close(
        result.scores["normalized_sequence_probability"], log_prob.mean(1).exp(), rtol=1e-5, atol=0
    )
    assert (result.scores["mutual_information"] > 1e-7).all()  # members that differ carry information
    # Each member's own greedy answer is that member's greedy decoding as a plain model.
    for m, member in enumerate(members):
        assert torch.equal(result.member_token_ids[m], greedy(member, ids, mask))


def test_the_predictive_averages_the_members_probabilities_not_their_logits(llama, prompts):
    """Two members whose heads ignore the features: member 0 puts 10.1, 9, 0 on tokens A, B, C, member 1 puts
    0, 9, 10. Their mean probability is highest on A (0.37 against B's 0.27); their mean logit on B."""
    with pytest.warns(UserWarning, match="start as one model"):
        ensemble = wrapped(llama, ensemble_size=2, sigma_init=0.0)
    A, B, C = 7, 8, 9
    with torch.no_grad():
        ensemble.method.heads.weight.zero_()
        ensemble.method.heads.bias.fill_(-30.0)
        ensemble.method.heads.bias[:, [A, B, C]] = torch.tensor([[10.1, 9.0, 0.0], [0.0, 9.0, 10.0]])
    logits = ensemble.method.heads.bias.detach().double()  # (M, V), every step's member logits
    assert int(logits.softmax(-1).mean(0).argmax()) == A and int(logits.mean(0).argmax()) == B
    result = ensemble.generate(input_ids=prompts[0], attention_mask=prompts[1], max_new_tokens=3)
    assert (result.token_ids == A).all()
    assert result.member_token_ids[0].eq(A).all() and result.member_token_ids[1].eq(C).all()
    assert result.scores["disagreement"].eq(1).all()


def test_members_one_at_a_time_decode_as_members_batched(llama, prompts):
    ids, mask = prompts
    batched = wrapped(llama, ensemble_size=3, sigma_init=0.05).generate(input_ids=ids, attention_mask=mask)
    alone = wrapped(llama, ensemble_size=3, sigma_init=0.05, members_at_once=1)
    one_at_a_time = alone.generate(input_ids=ids, attention_mask=mask)
    assert torch.equal(batched.token_ids, one_at_a_time.token_ids)
    assert torch.equal(batched.member_token_ids, one_at_a_time.member_token_ids)
    for name, value in batched.scores.items():
        torch.testing.assert_close(one_at_a_time.scores[name], value, rtol=1e-4, atol=1e-7)


def test_identical_members_carry_no_mutual_information(llama, prompts):
    ids, mask = prompts
    with pytest.warns(UserWarning, match="start as one model"):
        ensemble = wrapped(llama, ensemble_size=3, sigma_init=0.0)
    result = ensemble.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW)
    assert result.scores["mutual_information"].abs().max() < 1e-12
    assert result.scores["disagreement"].eq(0).all()


@pytest.mark.parametrize(
    ("method", "options"),
    [("mc_dropout", {"ensemble_size": 1, "num_samples": 3, "dropout": 0.2}), ("lora_ensemble", {"ensemble_size": 3})],
)
def test_the_baselines_give_the_same_scores(llama, prompts, method, options):
    ids, mask = prompts
    result = wrapped(llama, method, **options).generate(input_ids=ids, attention_mask=mask, num_samples=3)
    assert set(result.scores) == set(sve.metrics.sequence.SCORES)
    assert result.member_token_ids.shape[:2] == (3, 2)
    for value in result.scores.values():
        assert value.shape == (2,) and torch.isfinite(value).all()
    if method == "mc_dropout":  # each pass draws its own masks: the passes disagree
        assert (result.scores["mutual_information"] > 0).all()


def test_stop_strings_eos_and_max_new_tokens_end_the_answer(llama):
    tokenizer = char_tokenizer()
    ensemble = wrapped(llama, ensemble_size=2, sigma_init=0.05)
    prompt = "the cat sat on"
    free = ensemble.generate(prompt, tokenizer, max_new_tokens=NEW, member_answers=False)
    answer = free.token_ids[0].tolist()
    assert free.lengths.tolist() == [NEW] and len(free.texts) == 1
    # A stop string: the text of the answer's fourth token ends it there (kept, as transformers keeps it).
    stop = tokenizer.decode(answer[3:4]).replace("##", "")
    first = next(t for t in range(NEW) if stop in tokenizer.decode(answer[: t + 1], skip_special_tokens=True))
    stopped = ensemble.generate(prompt, tokenizer, max_new_tokens=NEW, stop_strings=[stop], member_answers=False)
    assert stopped.lengths.tolist() == [first + 1] and stop in stopped.texts[0]
    assert stopped.token_ids[0, : first + 1].tolist() == answer[: first + 1]
    assert (stopped.token_ids[0, first + 1 :] == tokenizer.pad_token_id).all()
    # An end-of-sequence token: the answer's third token ends it at its first occurrence.
    eos = answer[2]
    ended = ensemble.generate(prompt, tokenizer, max_new_tokens=NEW, eos_token_id=eos, member_answers=False)
    assert ended.lengths.tolist() == [answer.index(eos) + 1]
    # The scores read the answer only: the stopped answer's probability is its tokens' product.
    torch.testing.assert_close(
        stopped.scores["sequence_probability"], free.token_scores["log_prob"][:, : first + 1].sum(1).exp()
    )
    short = ensemble.generate(prompt, tokenizer, max_new_tokens=3, member_answers=False)
    assert short.lengths.tolist() == [3] and short.token_ids.tolist() == [answer[:3]]


def test_a_chat_template_is_applied_where_the_tokenizer_has_one(llama):
    tokenizer = copy.deepcopy(char_tokenizer())
    tokenizer.chat_template = "{% for m in messages %}q: {{ m['content'] }} a:{% endfor %}"
    ensemble = wrapped(llama, ensemble_size=1, sigma_init=0.0)
    chatted = ensemble.generate("hi", tokenizer, max_new_tokens=4, member_answers=False)
    ids = tokenizer("q: hi a:", add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert chatted.token_ids.tolist() == greedy(llama, ids, torch.ones_like(ids), 4).tolist()
    plain = ensemble.generate("hi", tokenizer, max_new_tokens=4, member_answers=False, chat=False)
    ids = tokenizer("hi", return_tensors="pt")["input_ids"]
    assert plain.token_ids.tolist() == greedy(llama, ids, torch.ones_like(ids), 4).tolist()


def test_generate_refuses_a_classifier_and_right_padding(llama, prompts):
    with pytest.raises(InputError, match="own lm_head as the members' heads"):
        wrapped(llama, ensemble_size=2, num_classes=3).generate(input_ids=prompts[0])
    ids, mask = prompts
    with pytest.raises(InputError, match="left-padded"):
        wrapped(llama, ensemble_size=1).generate(input_ids=ids, attention_mask=mask.flip(1))


def polygraph_modules(monkeypatch, *names: str) -> list:
    """Modules of LM-Polygraph (``lm_polygraph.<name>``) without its packages' ``__init__``s, which import
    openai, spacy and the rest of its generation stack; its estimators need numpy only, and its model module
    only lends them type hints (stubbed here)."""
    spec = importlib.util.find_spec("lm_polygraph")
    if spec is None:
        pytest.skip(
            "lm-polygraph is not installed: `pip install --no-deps lm-polygraph==0.7.0` (its full install adds "
            "spacy, bitsandbytes, openai, fschat and sentence-transformers, which this project does not pin)"
        )
    root = spec.submodule_search_locations[0]
    packages = ("utils", "estimators", "stat_calculators", "ue_metrics")
    for package in ("lm_polygraph", *(f"lm_polygraph.{p}" for p in packages)):
        stub = types.ModuleType(package)
        stub.__path__ = [root + package[len("lm_polygraph") :].replace(".", "/")]
        monkeypatch.setitem(sys.modules, package, stub)
    model = types.ModuleType("lm_polygraph.utils.model")
    model.Model = model.WhiteboxModel = object
    monkeypatch.setitem(sys.modules, "lm_polygraph.utils.model", model)
    for loaded in [k for k in sys.modules if k.startswith("lm_polygraph.") and k.count(".") > 1]:
        if loaded != "lm_polygraph.utils.model":
            monkeypatch.delitem(sys.modules, loaded)
    return [importlib.import_module(f"lm_polygraph.{name}") for name in names]


def test_msp_and_mean_entropy_agree_with_lm_polygraph(llama, prompts, monkeypatch):
    """At one member the predictive is the model: LM-Polygraph's statistics from transformers' own generate
    (its scores, as LM-Polygraph's WhiteboxModel reads them) give our MSP and mean token entropy."""
    probability, token_entropy, entropy = polygraph_modules(
        monkeypatch, "estimators.max_probability", "estimators.token_entropy", "stat_calculators.entropy"
    )
    ids, mask = prompts
    ensemble = wrapped(llama, ensemble_size=1, sigma_init=0.0)
    result = ensemble.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW)
    with torch.no_grad():
        out = llama.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=NEW, output_scores=True, return_dict_in_generate=True
        )
    log_probs = torch.stack(out.scores, 1).double().log_softmax(-1).numpy()  # (B, N, V)
    tokens = out.sequences[:, ids.shape[1] :].numpy()
    stats = {
        "greedy_log_probs": [list(row) for row in log_probs],
        "greedy_log_likelihoods": [row[np.arange(NEW), t] for row, t in zip(log_probs, tokens)],
    }
    stats.update(entropy.EntropyCalculator()(stats))
    msp = probability.MaximumSequenceProbability()(stats)  # -log p(answer)
    mean_entropy = token_entropy.MeanTokenEntropy()(stats)
    # Token by token, the predictive at M = 1 is transformers' own next-token distribution along its answer.
    theirs = np.stack(stats["greedy_log_likelihoods"])
    np.testing.assert_allclose(result.token_scores["log_prob"].numpy(), theirs, rtol=0, atol=1e-6)
    np.testing.assert_allclose(-np.log(result.scores["sequence_probability"].numpy()), msp, rtol=1e-5)
    np.testing.assert_allclose(result.scores["mean_token_entropy"].numpy(), mean_entropy, rtol=1e-5)
    assert math.isfinite(float(msp.sum()))
