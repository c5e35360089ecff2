"""``sve.wrap``: any method of the framework on a model the user already has, as peft's ``get_peft_model`` does.

    model = timm.create_model("resnet18", pretrained=True)
    ensemble = sve.wrap(model, method="sve", ensemble_size=4, num_classes=10)
    member_logits = ensemble(images)              # (M, B, C), the framework's one layout
    loss = ensemble.loss(member_logits, labels)   # Eq. 6: the mean member cross-entropy
    prediction = ensemble.predict(images)         # probabilities, entropy, mutual information, ...
    ensemble.calibrate(val_loader)                # one temperature on held-out data: predict, evaluate use it
    ensemble.conformalize(val_loader, alpha=0.1)  # predict gives sets that hold the label 90% of the time
    ensemble.save_pretrained("my-adapter")        # what training changed, as safetensors + JSON
    plain = ensemble.merge(member=0)              # member 0 as a plain model of the model's own class

The method is built from its config group (``sve/configs/method/<name>.yaml``): the same defaults as
``train.py method=<name>``, overridden by keyword arguments, and the same class, so every method is reachable
the same way. A ``Backbone`` of the framework is used as it is; any other ``nn.Module`` becomes a
``ModuleBackbone`` (features: the input of the model's head). With ``num_classes`` every member gets a fresh
head; without it the members start from the model's own head, so at zero init noise every member computes
exactly what the model did. Non-negative singular values are kept by an optimizer hook
(``sve.layers.sv_linear``): a plain loop needs nothing after ``optimizer.step()``.

Methods with a step after training take it from the ensemble: ``finish_training(loader)`` fits the Laplace
posteriors and puts the checkpoint ensemble's snapshots in use; ``end_epoch()`` takes a checkpoint
ensemble's snapshot. A deep ensemble here always holds its members in memory (``mode=in_memory``): its
sequential mode trains in rounds that only ``train.py`` drives.
"""

from __future__ import annotations

import operator
import warnings
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from sve.api import calibration, conformal, export
from sve.api.adapter_files import (
    check_fingerprint,
    example_from_spec,
    load_trained_state,
    locate,
    read_config,
    read_trained_state,
    save_adapter,
)
from sve.api.batches import Batches, examples, loader_logits, refuse_non_finite
from sve.api.module_backbone import ModuleBackbone, to_batch
from sve.api.options import method_class_and_defaults, method_config, parameter_groups, valid_options
from sve.api.starts import new_head_classes, newly_initialised, warn_if_one_new_head
from sve.backbones.base import Backbone, fingerprint
from sve.errors import InputError
from sve.layers.member import MemberLayer
from sve.methods import rates
from sve.methods.base import EnsembleMethod
from sve.methods.deep_ensemble import DeepEnsemble
from sve.metrics.collapse import collapse_warning, collapsed_members


def positive_integer(value) -> bool:
    """An integer (Python's, numpy's, a 0-d integer tensor's: anything with ``__index__``) above 0; not a bool."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return False
    return operator.index(value) > 0


def wrap(
    model: nn.Module,
    method: str = "sve",
    ensemble_size: int = 4,
    num_classes: int | None = None,
    target_modules: list[str] | str | None = None,
    head: str | None = "auto",
    pooling: str | None = None,
    example_input=None,
    head_is_new: bool | None = None,
    **options,
) -> Ensemble:
    """An ensemble of ``method`` on ``model`` (module docstring).

    Args:
        model: the user's network, or a framework ``Backbone``.
        method: a method's config name (``sve``, ``lora_ensemble``, ``deep_ensemble``, ...).
        ensemble_size: the member count M.
        num_classes: a fresh head per member with this many classes; None starts every member from the model's
            own (linear) head.
        target_modules: name patterns of the layers to adapt; None: every adaptable layer on the feature path
            (linears, and convolutions with groups = 1).
        head, pooling, example_input: how the features are read (``ModuleBackbone``).
        head_is_new: True: the model's head is untrained, so every member draws its own (as ``num_classes=``
            its class count); None: a head that transformers' ``from_pretrained`` initialised anew is detected
            and, kept for every member, warned about (``sve.api.starts``); False: no such warning.
        options: the method's own settings (``sigma_init``, ``rank``, ``dropout``, ``members_at_once``, ...).
    """
    # The arguments first: a bad method name or size is named before the model is probed (which may itself
    # ask for example_input).
    method_config(method)
    for name, value, optional in (("ensemble_size", ensemble_size, False), ("num_classes", num_classes, True)):
        if value is None and optional:
            continue
        if not positive_integer(value):
            raise ValueError(
                f"{name}={value!r} is not valid; expected a positive integer"
                + (" or None (keep the model's own head)" if optional else "")
            )
    if num_classes is not None and operator.index(num_classes) < 2:
        raise InputError(
            f"num_classes={num_classes} is not valid: the members are classifiers with a softmax over "
            "at least 2 classes; a binary task is num_classes=2"
        )
    # wrap works in place: a second wrap would stack members on members
    refuse_wrapped(
        model,
        "wrap works in place, as peft's get_peft_model does; wrap a copy made before the first "
        "wrap (copy.deepcopy(model)), or use the ensemble the first wrap returned",
    )
    if isinstance(target_modules, str):
        target_modules = [target_modules]
    # Read before the head is replaced: which parameters transformers initialised anew (sve.api.starts).
    new_parameters = None if head_is_new is not None or isinstance(model, Backbone) else newly_initialised(model)
    was_training = model.training
    with unchanged_on_error(model):
        if isinstance(model, Backbone):
            backbone = model
        else:
            backbone = ModuleBackbone(
                model, target_modules=target_modules, head=head, pooling=pooling, example_input=example_input
            )
        if head_is_new and num_classes is None:
            num_classes = new_head_classes(backbone)
        ensemble = build_ensemble(backbone, method, ensemble_size, num_classes, target_modules, pooling, options)
    warn_if_one_new_head(ensemble, new_parameters)
    # The model's mode is kept, as peft keeps it: a model loaded in eval mode (from_pretrained) is not trained with
    # dropout by the first call after wrapping; call ensemble.train() before a training loop of one's own.
    ensemble.train(was_training)
    return ensemble


def refuse_wrapped(model: nn.Module, advice: str) -> None:
    """An error, with ``advice``, when ``model`` already holds member layers (a wrap or from_pretrained ran on it)."""
    wrapped = next((n for n, m in model.named_modules() if isinstance(m, MemberLayer)), None)
    if wrapped is not None:
        raise InputError(
            f"{type(model).__name__} is already wrapped (its layer {wrapped!r} is a member layer): {advice}"
        )


@contextmanager
def unchanged_on_error(model: nn.Module):
    """A wrap that fails leaves ``model`` as it was. Wrapping works in place (the head becomes a feature tap,
    layers become member layers, the backbone is frozen), and an error can come after some of that (an option
    the method refuses, a head that cannot be kept); without this the user's model would be left half wrapped,
    its head gone, and a second try would fail on it as 'already wrapped'."""
    saved = [(m, dict(m._modules), dict(m._parameters), dict(m._buffers), m.training) for m in model.modules()]
    trainable = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    except BaseException:
        for module, children, parameters, buffers, mode in saved:
            for now, before in (
                (module._modules, children),
                (module._parameters, parameters),
                (module._buffers, buffers),
            ):
                now.clear()
                now.update(before)
            module.training = mode
        for parameter, flag in trainable:
            parameter.requires_grad_(flag)
        raise


def build_ensemble(
    backbone: Backbone,
    method: str,
    ensemble_size: int,
    num_classes: int | None,
    target_modules: list[str] | None,
    pooling: str | None,
    options: dict,
) -> Ensemble:
    """The method on a built backbone; ``wrap``'s second half, and ``from_pretrained``'s after the fingerprint
    check."""
    cls, defaults = method_class_and_defaults(method)
    defaults.update(rates.default_options(method))  # a measured sv_lr, not the config's grid start
    valid = valid_options(cls, defaults)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"wrap(method={method!r}) got unknown option(s) {unknown}; valid options are {valid}")
    if num_classes is None:
        combined = getattr(backbone, "combined_heads", [])
        if combined and getattr(backbone, "head_name", None) == combined[0]:
            raise ValueError(
                f"num_classes=None keeps the model's own head, but this model combines {len(combined)} "
                f"heads ({', '.join(map(repr, combined))}), which no member can start as; give "
                f"num_classes (fresh heads on the input of {combined[0]!r}), or head= one of them to "
                "keep that head alone"
            )
        if not isinstance(backbone, ModuleBackbone) or backbone.head_weights is None:
            hint = getattr(backbone, "head_hint", "")
            raise ValueError(
                "num_classes=None keeps the model's own head, but this model has no linear head "
                f"(head={getattr(backbone, 'head_name', None)!r}); give num_classes" + (f", or: {hint}" if hint else "")
            )
        if backbone.head_weights[0].shape[0] < 2:  # a regression, or one binary logit read with a sigmoid
            raise InputError(
                f"the model's head {backbone.head_name!r} has 1 output: a regression or a one-logit "
                "binary classifier, which the softmax of the members cannot read (every prediction "
                "would be certain); give num_classes=2 for fresh two-class heads"
            )
        backbone.keep_head = True
        num_classes = backbone.head_weights[0].shape[0]
    settings = {**defaults, **options, "target_modules": list(target_modules) if target_modules else None}
    if issubclass(cls, DeepEnsemble):  # deep_ensemble, deep_ensemble_lora
        settings["mode"] = "in_memory"  # module docstring
    task = "its own head" if getattr(backbone, "keep_head", False) else None  # recorded in head_init
    built = cls(backbone, ensemble_size=int(ensemble_size), num_classes=int(num_classes), task=task, **settings)
    config = {
        "method": method,
        "ensemble_size": int(ensemble_size),
        "num_classes": int(num_classes),
        "target_modules": list(built.target_modules if target_modules is None else target_modules),
        "head": getattr(backbone, "head_name", None),
        "pooling": pooling,
        "keep_head": bool(getattr(backbone, "keep_head", False)),
        "options": {k: v for k, v in settings.items() if k != "target_modules"},
    }
    return Ensemble(built, config)


class Ensemble(nn.Module):
    """The wrapped model: ``forward`` gives member logits (M, B, C); ``predict`` the predictive and its
    uncertainty. Call it as the model is called (positional tensors, keyword arguments, or one batch dict).

    Attributes:
        method: the framework's method (an ``EnsembleMethod``), which holds the backbone.
        config: what ``wrap`` was asked, resolved (the adapter files record it).
        calibration: the fitted temperature (``calibrate``), None before; the adapter files record it.
        conformal: the fitted set threshold (``conformalize``), None before; the adapter files record it.
    """

    def __init__(self, method: EnsembleMethod, config: dict):
        super().__init__()
        self.method = method
        self.config = config
        self.calibration: dict | None = None
        self.conformal: dict | None = None
        self.conformal_calibration: dict | None = None  # conformalize's examples, in memory only (sve.api.conformal)

    @property
    def ensemble_size(self) -> int:
        return self.method.ensemble_size

    def forward(self, *args, **kwargs) -> Tensor:
        batch = to_batch(args, kwargs)
        if examples(batch) == 0:  # nothing to run the model on (a last, empty batch): no member logits
            heads = self.method.heads.weight
            return heads.new_empty(self.method.num_members(), 0, self.method.num_classes)
        return self.method(batch)

    def predict(self, *args, aggregate: str = "probs", calibrated: bool | None = None, **kwargs):
        """``sve.Prediction`` of the inputs, in evaluation mode (the mode is restored); an input row that
        holds NaN or inf is an error naming it (training refuses such inputs too). Its predictive is
        temperature scaled once ``calibrate`` has run (``calibrated=False``: the raw one; True: an error when
        the ensemble is not calibrated; ``sve.api.calibration.prediction``). Once ``conformalize`` has run, its
        ``sets`` (B, C) are each example's conformal set (``sve.api.conformal``)."""
        batch = to_batch(args, kwargs)
        refuse_non_finite(batch, "predict")
        temperature = calibration.temperature_for(self.calibration, aggregate, calibrated)
        was_training = self.training
        self.eval()  # the predictive's member count (samples, snapshots) is the evaluation one
        try:
            with torch.no_grad():  # a prediction, not a step: no graph is kept (call the ensemble for gradients)
                logits = self(batch)
        finally:
            self.train(was_training)
        return self.with_sets(logits, calibration.prediction(logits, aggregate, temperature))

    def with_sets(self, logits: Tensor, prediction):
        """``prediction`` with the conformal sets of ``logits``, of the predictive the threshold was fitted on."""
        if self.conformal is None:
            return prediction
        fitted = calibration.prediction(logits, self.conformal["aggregate"], self.conformal["temperature"])
        return replace(prediction, sets=conformal.sets(self.conformal, fitted))

    def predict_loader(self, loader, aggregate: str = "probs", calibrated: bool | None = None, progress: bool = True):
        """``predict`` over every batch of ``loader``: one ``sve.Prediction`` for all its examples, in order.
        Batches are bare inputs, (inputs, labels) pairs or dicts (``as_batch``); they go to the ensemble's
        device."""
        temperature = calibration.temperature_for(self.calibration, aggregate, calibrated)
        logits, _ = loader_logits(self, loader, progress, "predicting")
        return self.with_sets(logits, calibration.prediction(logits, aggregate, temperature))

    def evaluate(self, loader, aggregate: str = "probs", n_bins: int = 15, progress: bool = True, ood=None) -> dict:
        """The metrics ``train.py`` reports, of the ensemble on a labelled ``loader``: the predictive's ``acc``,
        ``ece``, ``nll``, ``brier``, each member's (``member_acc``, ...), ``disagreement``,
        ``mutual_information``, the ECE's ``reliability`` bins, selective prediction's ``aurc`` and its
        ``risk_coverage`` curve (``sve.metrics.scores.score``); with an ``ood`` loader (labels not needed) also
        ``ood_auroc``, ``ood_auprc``, ``ood_fpr95`` and, for more than one member, the same by mutual
        information ``ood_auroc_mi``, ... (``sve.metrics.scores.ood_scores``); once ``calibrate`` has run, also
        ``temperature``, ``ts_acc``, ``ts_ece`` and ``ts_nll`` (results.json's ``test/ts_*``);
        ``collapsed_members``: the members whose output hardly depends on the input (a warning names them,
        ``sve.metrics.collapse``); once ``conformalize`` has run, ``conformal``: the coverage, mean and median
        set size, size-stratified and class-conditional coverage at the fitted threshold (``fitted``) and, while
        the calibration examples are in memory, of every score at alpha 0.1 and 0.05 (``by_alpha``;
        ``sve.api.conformal.evaluation``)."""
        from sve.metrics.scores import ood_scores, score

        temperature = calibration.temperature_for(self.calibration, aggregate, None)
        logits, labels = loader_logits(self, loader, progress, "evaluating", labelled_for="evaluate")
        metrics = score(logits, labels, aggregate, n_bins)
        if temperature is not None:
            metrics.update(calibration.metrics(logits, labels, aggregate, temperature, n_bins))
        if ood is not None:
            outside, _ = loader_logits(self, ood, progress, "evaluating the OOD set")
            metrics.update(ood_scores(logits, outside, aggregate))
        if self.conformal is not None:
            fitted = calibration.prediction(logits, self.conformal["aggregate"], self.conformal["temperature"])
            held, keys = self.conformal_calibration, conformal.example_keys(logits)
            metrics["conformal"] = conformal.evaluation(self.conformal, held, fitted, labels, keys)
        metrics["collapsed_members"] = collapsed_members(logits)  # as results.json's test/collapsed_members
        if metrics["collapsed_members"]:
            warning = collapse_warning(metrics["collapsed_members"], len(logits), "example", "parameter_groups(lr=)")
            warnings.warn(warning, stacklevel=2)
        return metrics

    def reliability_diagram(
        self,
        loader,
        path=None,
        aggregate: str = "probs",
        title: str = "",
        progress: bool = True,
        calibrated: bool | None = None,
    ):
        """The reliability diagram of the ensemble on a labelled ``loader``: a matplotlib Figure (shown in a
        notebook), written to ``path`` when given (a file type's suffix writes that file; none writes
        ``<path>.png`` and ``<path>.pdf``). ``sve.metrics.plots.reliability_figure``. The predictive drawn is
        ``predict``'s: temperature scaled once ``calibrate`` has run (``calibrated=False``: the raw one; True: an
        error when the ensemble is not calibrated), and the title says which, with T."""
        from sve.metrics.plots import reliability_figure

        temperature = calibration.temperature_for(self.calibration, aggregate, calibrated)
        logits, labels = loader_logits(self, loader, progress, "evaluating", labelled_for="reliability_diagram")
        probs = calibration.prediction(logits, aggregate, temperature).probs
        # Without this the figure of a calibrated ensemble could not be told from the raw one's.
        which = "raw predictive" if temperature is None else f"temperature-scaled predictive (T = {temperature:.3g})"
        return reliability_figure(probs.numpy(), labels.numpy(), f"{title}: {which}" if title else which, path)

    def calibrate(self, loader, method: str = "temperature", aggregate: str = "probs", progress: bool = True) -> dict:
        """Fits the ensemble's temperature on a labelled, held-out ``loader`` (a validation split, never the
        training data) by the NLL of its ``aggregate`` predictive, as ``train.py`` fits ``test/temperature``
        on ``val``. ``predict`` and ``evaluate`` use it from then on, and ``save_pretrained`` records it.
        Returns the record (``method``, ``temperature``, ``aggregate``, ``examples``)."""
        logits, labels = loader_logits(self, loader, progress, "calibrating", labelled_for="calibrate")
        self.calibration = calibration.fit(logits, labels, aggregate, method)
        return dict(self.calibration)

    def conformalize(
        self,
        loader,
        alpha: float = 0.1,
        score: str = "thr",
        aggregate: str = "probs",
        calibrated: bool | None = None,
        progress: bool = True,
        **options,
    ) -> dict:
        """Fits the conformal threshold on a labelled, held-out ``loader`` (never the training data nor the test
        set): from then on ``predict`` gives each example's set (``Prediction.sets``), which holds the true class
        with probability at least 1 - ``alpha``, ``evaluate`` reports the sets' metrics and ``save_pretrained``
        records the threshold. ``score``: ``thr`` (= ``lac``), ``aps``, ``raps`` (``options`` ``k_reg``, ``lam``)
        or ``thr_mi``, whose sets grow with the members' disagreement (``beta``); ``sve.metrics.conformal``. The
        predictive is the temperature scaled one where ``calibrate`` ran (``calibrated`` as ``predict``'s).
        Returns the record (``score``, ``alpha``, ``threshold``, ``options``, ``aggregate``, ``temperature``,
        ``examples``)."""
        temperature = calibration.temperature_for(self.calibration, aggregate, calibrated)
        logits, labels = loader_logits(self, loader, progress, "conformalizing", labelled_for="conformalize")
        fitted = calibration.prediction(logits, aggregate, temperature)
        self.conformal = conformal.fit(fitted, labels, alpha, score, aggregate, temperature, options)
        self.conformal_calibration = {
            "probs": fitted.probs,
            "labels": labels,
            "mutual_information": fitted.mutual_information,
            "keys": set(conformal.example_keys(logits)),
        }
        return dict(self.conformal)

    def generate(self, prompts=None, tokenizer=None, **options):
        """Text from a wrapped causal LM (``sve.wrap(model, pooling="last")``), decoded from the members'
        predictive, each member's own greedy answer and the answers' uncertainty scores: an
        ``sve.api.generation.Generation``. Options as transformers' ``generate`` names them (``max_new_tokens``,
        ``do_sample``, ``temperature``, ``top_p``, ``eos_token_id``, ``stop_strings``), ``chat`` (the
        tokenizer's chat template), ``num_samples`` and ``meaning`` (``sve.api.generation.generate``)."""
        from sve.api.generation import generate

        return generate(self, prompts, tokenizer, **options)

    def loss(self, member_logits: Tensor, labels: Tensor) -> Tensor:
        return self.method.loss(member_logits, labels)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.method.trainable_parameters()

    def parameter_groups(self, lr: float | None = None) -> list[dict]:
        """What to give the optimizer, each group with its learning rate: ``torch.optim.AdamW(
        ensemble.parameter_groups())``. ``lr`` (else ``wrap``'s ``lr=``, else the rate of the method's config:
        ``sve.api.options.parameter_groups``) for every group but one that trains at a rate of its own (the
        singular values' ``sv_lr`` of ``sve_lora``). The groups name their rates, so an ``lr=`` given to the
        optimizer itself is not used: give it here."""
        return parameter_groups(self.method, self.config["method"], lr)

    def parameter_counts(self) -> dict[str, int]:
        """``trainable``: what the optimizer updates; ``stored``: every tensor held (U and V included);
        ``base``: the backbone's own parameters before wrapping."""
        counts = self.method.parameter_counts()
        return {"trainable": counts["trainable"], "stored": counts["total"], "base": self.method.base_parameter_count}

    def merge(self, member: int | None = None, mean: bool = False) -> nn.Module:
        """Member ``member`` as a plain model of the wrapped model's class, merged weights and its head in
        place; ``mean=True``: the model of the members' mean weights, which is one network, not the ensemble
        (its prediction is not the ensemble's predictive). SVE, SVF, the LoRA methods, BatchEnsemble; an error
        for methods whose members are samples, snapshots or whole copies (``sve.api.export``)."""
        return export.merge(self, member, mean)

    # ----- the steps some methods take outside the optimizer ------------------------------------------------------
    def end_epoch(self) -> None:
        """After each training epoch (a checkpoint ensemble snapshots its weights)."""
        self.method.on_train_epoch_end(None)

    def finish_training(self, loader=None, batch_size: int | None = None) -> None:
        """After training: a Laplace method fits its posterior on ``loader`` (batches as (inputs, labels) or
        dicts with ``labels``); a checkpoint ensemble starts using its snapshots."""
        data = None
        if loader is not None:
            batches = Batches(loader)
            data = SimpleNamespace(
                train_dataloader=lambda: batches, batch_size=batch_size or getattr(loader, "batch_size", None) or 32
            )
        self.method.after_fit(data)

    # ----- adapter files --------------------------------------------------------------------------------------------
    def save_pretrained(self, directory, **hub) -> None:
        save_adapter(self, directory, **hub)

    @classmethod
    def from_pretrained(cls, model: nn.Module, directory, **overrides) -> Ensemble:
        return load_ensemble(model, directory, **overrides)


def load_ensemble(model: nn.Module, name_or_path: str | Path, **overrides):
    """The ensemble of ``sve.wrap`` rebuilt on ``model`` from an adapter directory or Hub repo.

    ``overrides`` replace recorded method options that do not change the trained state (``inference``,
    ``members_at_once``, ``svd_cache``, ...)."""
    refuse_wrapped(model, "from_pretrained needs the base model as it was before wrapping (a fresh copy of it)")
    directory = locate(name_or_path)
    config = read_config(directory)
    if config.get("backbone") != "ModuleBackbone":
        raise InputError(
            f"{directory} was written by a run of train.py ({config.get('backbone')}); evaluate it "
            f"with `sve-eval {directory}`, or rebuild its backbone from the run's config"
        )
    trained = read_trained_state(directory)  # a damaged file is named now, not after the SVD
    spec = config.get("example_input")
    with unchanged_on_error(model):  # a refused adapter (another base model, say) leaves the model as it was
        try:
            backbone = ModuleBackbone(
                model,
                target_modules=config["target_modules"],
                head=config["head"],
                pooling=config["pooling"],
                example_input=example_from_spec(spec) if spec else None,
            )
        except Exception:
            # The backbone probes the model on the recorded example, which fails deep inside a model of
            # another input size: the fingerprint (of the model without its head, as the backbone takes it)
            # names the cause, if it is the cause.
            check_fingerprint(config, fingerprint(model, without=config["head"]), directory)
            raise
        check_fingerprint(config, backbone.fingerprint(), directory)
        options = {**config["options"], **overrides}
        ensemble = build_ensemble(
            backbone,
            config["method"],
            config["ensemble_size"],
            None if config["keep_head"] else config["num_classes"],
            config["target_modules"],
            config["pooling"],
            options,
        )
        load_trained_state(ensemble.method, directory, trained)
    ensemble.calibration = calibration.read(config.get("calibration"), directory)
    ensemble.conformal = conformal.read(config.get("conformal"), directory)
    return ensemble
