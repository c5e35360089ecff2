"""A wrapped Hugging Face model trained by ``transformers.Trainer`` (``sve.api.hf_trainer``) trains as a plain
PyTorch loop trains it (Eq. 6 read as the Trainer's loss, the singular values projected after every step), its
``compute_metrics`` gives the metrics that numpy computes from the member logits, and every checkpoint holds
adapter files that rebuild the trained ensemble."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import sve
from sve.api.hf_trainer import EnsembleCallback, TrainerModel, compute_metrics
from sve.backbones.tokenizers import char_tokenizer
from sve.layers.sv_linear import SVLinear

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:SVE. the head is pretrained")

STEPS, LR = 8, 0.05  # a rate at which the loss falls within a few full-batch steps, and singular values hit 0
POSITIVE = ["a good film", "great acting", "good fun", "a great plot", "so good", "great cast", "good story", "great"]
NEGATIVE = ["a bad film", "awful acting", "bad fun", "an awful plot", "so bad", "awful cast", "bad story", "awful"]


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(char_tokenizer()),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
        hidden_dropout_prob=0.0,  # deterministic, so the plain loop can repeat the Trainer's steps exactly
        attention_probs_dropout_prob=0.0,
        initializer_range=0.5,  # features that tell the sentences apart: the loss falls within a few steps
    )
    return BertForSequenceClassification(config).eval()


def wrapped():
    model = tiny_bert()
    torch.manual_seed(1)  # the members' init noise
    return sve.wrap(model, method="sve", ensemble_size=2, sigma_init=0.1)


def toy_dataset() -> Dataset:
    """Tokenised sentences with their text kept: the Trainer must drop the column the model does not read."""
    data = Dataset.from_dict({"sentence": POSITIVE + NEGATIVE, "label": [1] * 8 + [0] * 8})
    tokens = lambda rows: char_tokenizer()(rows["sentence"], padding="max_length", max_length=16)  # noqa: E731
    return data.map(tokens, batched=True)


def trainer_for(ensemble, data, output_dir) -> Trainer:
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=STEPS,
        per_device_train_batch_size=len(data),  # the full batch: the plain loop needs no data order
        per_device_eval_batch_size=5,  # batches of unequal size in the prediction loop
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping
        logging_steps=1,
        save_strategy="steps",
        save_steps=STEPS,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    return Trainer(
        model=TrainerModel(ensemble),
        args=args,
        train_dataset=data,
        eval_dataset=data,
        compute_metrics=compute_metrics,
        callbacks=[EnsembleCallback(ensemble)],
    )


def model_inputs(data: Dataset) -> dict:
    return {k: torch.tensor(data[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}


def numpy_metrics(member_logits: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """acc, ECE (right-closed equal-width bins), NLL and Brier of the mean member probabilities."""
    z = member_logits - member_logits.max(-1, keepdims=True)
    probs = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).mean(0)
    confidence, predicted = probs.max(-1), probs.argmax(-1)
    bins = np.clip(np.ceil(confidence * n_bins).astype(int) - 1, 0, n_bins - 1)
    ece = sum(
        abs((predicted[bins == b] == labels[bins == b]).sum() - confidence[bins == b].sum()) for b in range(n_bins)
    ) / len(labels)
    return {
        "acc": float((predicted == labels).mean()),
        "ece": float(ece),
        "nll": float(-np.log(probs[np.arange(len(labels)), labels]).mean()),
        "brier": float(((probs - np.eye(probs.shape[1])[labels]) ** 2).sum(-1).mean()),
    }


def test_the_trainer_trains_as_a_plain_loop_and_saves_adapters_that_reload(tmp_path):
    data = toy_dataset()
    ensemble = wrapped()
    calls = []
    project = ensemble.method.constrain_
    ensemble.method.constrain_ = lambda: (calls.append(1), project())[1]
    trainer = trainer_for(ensemble, data, tmp_path / "out")
    trainer.train()

    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == STEPS and losses[-1] < 0.8 * losses[0], losses
    assert len(calls) == STEPS  # the callback's projection after every optimizer step

    # The same steps by hand: AdamW at the same rate on the ensemble's trainable tensors, Eq. 6 on the full batch.
    reference = wrapped()
    optimizer = torch.optim.AdamW(reference.trainable_parameters(), lr=LR, weight_decay=0.0)
    inputs, labels = model_inputs(data), torch.tensor(data["label"])
    reference.train()
    for _ in range(STEPS):
        loss = reference.loss(reference(**inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = dict(ensemble.method.named_parameters())
    sv = [n for n in trained if n.endswith("singular_values")]
    assert sv and all(bool((trained[n] >= 0).all()) for n in sv)
    assert any(bool((trained[n] == 0).any()) for n in sv)  # the rate drives some to zero: projected there
    for name, tensor in reference.method.named_parameters():
        # A key's bias shifts every score of a query alike, which the softmax ignores: its gradient is rounding
        # error alone, which Adam scales up to full steps in no particular direction.
        if tensor.requires_grad and not name.endswith("key.biases"):
            torch.testing.assert_close(trained[name], tensor, rtol=1e-4, atol=1e-5, msg=name)

    # compute_metrics: the framework's metrics of the predictive, as numpy computes them from the member logits.
    metrics = trainer.evaluate()
    ensemble.eval()
    with torch.no_grad():
        member_logits = ensemble(**inputs).double().numpy()
    expected = numpy_metrics(member_logits, labels.numpy())
    for key, value in expected.items():
        assert metrics[f"eval_{key}"] == pytest.approx(value, abs=1e-6), key

    # The checkpoint's adapter files rebuild the trained ensemble on a fresh base model.
    checkpoint = tmp_path / "out" / f"checkpoint-{STEPS}"
    assert (checkpoint / "adapter_config.json").is_file() and (checkpoint / "adapter_model.safetensors").is_file()
    again = sve.from_pretrained(tiny_bert(), checkpoint)
    expected_probs = ensemble.predict(**inputs).probs
    torch.testing.assert_close(again.predict(**inputs).probs, expected_probs, rtol=0, atol=0)
    # The Trainer's own weights file (what resume_from_checkpoint loads, strict=False) holds the trained tensors
    # only, and they load strictly into a model wrapped as before.
    saved = load_file(str(checkpoint / "model.safetensors"))
    resumed = TrainerModel(wrapped())
    assert set(saved) == {n for n, p in resumed.named_parameters() if p.requires_grad}
    resumed.load_state_dict(saved, strict=True)
    torch.testing.assert_close(resumed.ensemble.predict(**inputs).probs, expected_probs, rtol=0, atol=0)


def test_the_model_names_its_inputs_for_the_trainer_and_returns_the_log_predictive():
    ensemble = wrapped()
    model = TrainerModel(ensemble)
    assert {"input_ids", "attention_mask", "token_type_ids"} <= set(model.inputs) and "labels" not in model.inputs
    inputs = model_inputs(toy_dataset().select(range(3)))
    model.eval()
    with torch.no_grad():
        out = model(**inputs)
        member_logits = ensemble(**inputs)
    assert out.loss is None and out.logits.shape == (3, 2)
    torch.testing.assert_close(out.logits.exp(), member_logits.double().softmax(-1).mean(0))
    labels = torch.tensor([1, 0, 1])
    with torch.no_grad():
        loss = model(labels=labels, **inputs).loss
    expected = torch.stack([torch.nn.functional.cross_entropy(m, labels) for m in member_logits]).mean()
    torch.testing.assert_close(loss, expected)


def test_a_negative_singular_value_is_projected_at_the_step_end():
    ensemble = wrapped()
    layer = next(m for m in ensemble.modules() if isinstance(m, SVLinear))
    with torch.no_grad():
        layer.singular_values[0, 0] = -1.0
    EnsembleCallback(ensemble).on_step_end(None, None, None)
    assert layer.singular_values[0, 0].item() == 0.0


def test_an_optimizer_that_ignores_a_methods_own_rate_is_named(caplog):
    model = tiny_bert()
    ensemble = sve.wrap(model, method="sve_lora_rates", ensemble_size=2)  # its singular values train at sv_lr
    callback = EnsembleCallback(ensemble)
    with caplog.at_level("WARNING", logger="sve.api.hf_trainer"):
        callback.on_train_begin(None, None, None, optimizer=torch.optim.AdamW(ensemble.trainable_parameters(), lr=0.1))
    assert "optimizers=(torch.optim.AdamW(ensemble.parameter_groups()" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sve.api.hf_trainer"):
        callback.on_train_begin(None, None, None, optimizer=torch.optim.AdamW(ensemble.parameter_groups(), lr=0.1))
    assert not caplog.text
