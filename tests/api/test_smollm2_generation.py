"""Generation on the real SmolLM2-135M (`make smollm2`; skipped without it): through ``sve.wrap`` at one member
equal to the model it is transformers' greedy answer token for token with the real tokenizer; and the committed
Single w/ SVF run of the sized ARC table, loaded from its adapter, writes again the first batch of its committed
open-ended answers (the same texts and judgements, the scores to float rounding)."""

import json
import shutil

import pytest
import torch

import sve
from sve.runs.open_answers import DIRECTORY, answer_questions
from tests.conftest import ROOT, installed, shared_path

RUN = ROOT / "results" / "mini" / "runs" / "mini_arc_sized_smollm2" / "svf_m1" / "seed0"


def test_one_member_is_transformers_greedy_on_smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = installed("smollm2_135m", "config.json").parent
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = "Question: Which gas do plants take in from the air?\nAnswer:"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = model.generate(input_ids=ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1] :]
    # The last block's attention only: what is checked is the decoding path, and the SVD of all 210 layers
    # would take a minute.
    last = [r"layers\.29\.self_attn\.(q|k|v|o)_proj"]
    ensemble = sve.wrap(model, method="sve", ensemble_size=1, sigma_init=0.0, pooling="last", target_modules=last)
    result = ensemble.generate(prompt, tokenizer, max_new_tokens=10, member_answers=False, chat=False)
    assert result.token_ids[0, : int(result.lengths[0])].tolist() == expected[: int(result.lengths[0])].tolist()


def test_the_committed_svf_run_writes_its_committed_answers_again(tmp_path):
    installed("smollm2_135m", "config.json")
    shared_path("data", "arc_easy")
    committed = [json.loads(line) for line in (RUN / DIRECTORY / "answers.jsonl").read_text().splitlines()]
    protocol = json.loads((RUN / DIRECTORY / "protocol.json").read_text())
    copy = tmp_path / "seed0"
    shutil.copytree(RUN, copy, ignore=shutil.ignore_patterns("evaluations"))
    batch = protocol["batch_size"]
    path = answer_questions(copy, questions=batch, batch_size=batch)
    again = [json.loads(line) for line in path.read_text().splitlines()]
    for new, old in zip(again, committed[:batch], strict=True):
        assert (new["answer"], new["samples"], new["correct"], new["exact"]) == (
            old["answer"],
            old["samples"],
            old["correct"],
            old["exact"],
        )
        # float32 on another CPU or thread count: each token's log-probability moves by about 1e-6 relative
        # and the sequence probability multiplies up to 12 of them (1.4e-5 seen on a fresh machine under load)
        assert new["scores"] == pytest.approx(old["scores"], rel=1e-4, abs=1e-7)
