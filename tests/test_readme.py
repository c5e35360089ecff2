"""The README's Python examples run as they stand and do what their comments say: members predict with their
uncertainty, and every ensemble they build saves and reloads on a fresh copy of its base to identical
predictions, while a base with other weights is refused."""

import copy
import re

import pytest
import torch

import sve
from sve.errors import InputError
from tests.conftest import ROOT


def readme_blocks(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    part = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", part, flags=re.S)


def inputs_for(ensemble, scope) -> dict:
    ids = scope["ids"]
    if ensemble is scope["text"]:
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if ensemble is scope["plain"]:
        return {"_arg0": torch.randn(3, 16)}
    return {"_arg0": scope["images"]}


def test_the_own_model_examples_run_verbatim_and_every_adapter_reloads_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the first example writes ./resnet18-sve
    monkeypatch.setenv("SVE_SVD_CACHE", str(tmp_path / "svd"))  # each weight's SVD once, then read back
    bases = {}  # each ensemble's base as it was before wrap changed it in place: the fresh copy to load on
    wrap = sve.wrap

    def keeping_the_base(model, *args, **kwargs):
        base = copy.deepcopy(model)
        ensemble = wrap(model, *args, **kwargs)
        bases[id(ensemble)] = base
        return ensemble

    monkeypatch.setattr(sve, "wrap", keeping_the_base)
    torch.manual_seed(0)
    scope: dict = {}
    for block in readme_blocks("SVE on your own model"):
        exec(compile(block, "README.md", "exec"), scope)
    ensemble, images = scope["ensemble"], scope["images"]
    assert ensemble(images).shape == (4, 8, 10)
    torch.testing.assert_close(scope["prediction"].probs.sum(-1), torch.ones(8, dtype=torch.float64))
    counts = ensemble.parameter_counts()
    assert counts["trainable"] < 0.05 * counts["base"] < counts["stored"]
    ensemble.eval(), scope["again"].eval()
    with torch.no_grad():
        assert torch.equal(ensemble(images), scope["again"](images))  # the example's own reload

    # The calls of the first block do what their comments say.
    metrics = scope["metrics"]
    assert metrics["temperature"] == scope["ensemble"].calibration["temperature"]  # calibrate ran: ts_* beside
    assert {"ts_nll", "ts_ece", "ts_acc", "aurc", "augrc", "adaptive_ece", "ood_auroc", "ood_auroc_mi"} <= set(metrics)
    conformal = ensemble.conformal  # fitted on held_out, of the temperature-scaled predictive
    assert (conformal["score"], conformal["alpha"], conformal["examples"]) == ("aps", 0.1, 40)
    assert conformal["temperature"] == ensemble.calibration["temperature"]
    assert scope["prediction"].sets.shape == (8, 10) and scope["again"].conformal == conformal
    assert set(metrics["conformal"]["by_alpha"]) == {"0.1", "0.05"} and metrics["conformal"]["calibration_overlap"] == 0
    assert (tmp_path / "plots" / "reliability.png").is_file()
    assert type(scope["member"]) is type(bases[id(ensemble)])  # the original class, not a wrapper
    with torch.no_grad():
        torch.testing.assert_close(scope["member"].eval()(images), ensemble(images)[0], rtol=1e-4, atol=1e-4)
    # The Trainer block trained the text ensemble and evaluated it with the framework's metrics.
    assert scope["trainer"].state.global_step == 2
    assert (tmp_path / "bert-sve-trainer" / "checkpoint-2" / "adapter_config.json").is_file()

    built = [scope[k] for k in ("ensemble", "plain", "text", "vit")]
    assert len(bases) == len(built)
    for i, wrapped in enumerate(built):
        batch = inputs_for(wrapped, scope)
        wrapped.save_pretrained(tmp_path / f"adapter{i}")
        loaded = sve.from_pretrained(copy.deepcopy(bases[id(wrapped)]), tmp_path / f"adapter{i}")
        expected, got = wrapped.predict(batch), loaded.predict(batch)
        assert torch.equal(expected.probs, got.probs) and torch.equal(
            expected.mutual_information, got.mutual_information
        )
        other = copy.deepcopy(bases[id(wrapped)])
        with torch.no_grad():
            next(p for p in other.parameters() if p.dim() >= 2).mul_(1.01)  # on the feature path
        with pytest.raises(InputError, match="trained on another base model"):
            sve.from_pretrained(other, tmp_path / f"adapter{i}")


def test_the_generation_example_runs_verbatim_and_scores_its_answer():
    from sve.metrics.sequence import SCORES

    torch.manual_seed(0)
    scope: dict = {}
    (block,) = readme_blocks("Language models")
    exec(compile(block, "README.md", "exec"), scope)
    answer = scope["answer"]
    assert len(answer.texts) == 1 and len(answer.member_texts) == 4 and len(answer.samples[0]) == 5
    assert set(answer.scores) == set(SCORES)
    assert 1 <= int(answer.lengths[0]) <= 8 and ("." in answer.texts[0] or int(answer.lengths[0]) == 8)
