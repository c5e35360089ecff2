"""The method interface: wrap a backbone, return member logits in the (M, B, C) layout of ``sve.members``.

``EnsembleMethod`` does the work every method shares, once: it probes which parts of the backbone produce
the features (``Backbone.probe_usage``), sets what trains (the backbone or not; unused parameters never, so
every trainable parameter gets a gradient and DDP runs), wraps the target layers through the method's
``make_layer`` (``sve.layers.inject``), builds one head per member (or one shared head), counts and logs. A method is
then one class with its own logic: ``make_layer`` and, where members are not simply the layers' members,
``num_members``/``member_features``/``select``.

Members run in chunks (``members_at_once``): ``all`` stacks every member's copy of the batch member-major
and runs the backbone once; ``k`` runs k members per pass with ``select``, so activation memory drops about
M/k-fold; ``1`` works on any architecture whatever its internal layout. In training, ``k`` also splits the
backward: the LightningModule runs and back-propagates one chunk at a time (``training_chunks``), gradients
add up across the chunks, and only one chunk's activations are alive at once. The step is the one all
members at once would take (the loss is a sum over members, and each member draws its own dropout masks,
``sve.layers.draws``), so ``k`` trades time for memory and never changes what is trained.

``auto`` runs all members at once in training and on accelerators, and evaluates on the CPU with passes of at
most ``CPU_EVAL_EXAMPLES`` examples (members x batch): there the activations of all members of a large batch
overflow the CPU's caches, so one member per pass is faster, while the few examples of all members at batch 1
still run best at once (the batched and one-at-a-time rows of results/bench/bench.md). With one member per
pass, the member-free layers that read the batch itself (a ViT's patch embedding, BERT's embeddings) run once,
not once per member (``sve.layers.shared_inputs``).

Whether members may be stacked at all is decided once, before any pass stacks them (``probe_member_layout``):
a member layer whose input is not batch-first, or whose owner reads its weight, raises ``MemberLayoutError``
on a probe of two members, and the method then runs its members one at a time, with one warning in the log
naming the module: never a silently wrong result. The probe runs when the method is built, or, where no layer
had two members then (samples and snapshots are installed later), on the first example of the first batch
that would stack them, before that batch runs. ``forward`` is then one path, with no retry.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.backbones.base import Backbone
from sve.errors import InputError
from sve.layers.draws import restore_rng_states, rng_states
from sve.layers.inject import ALL, as_patterns, every_layer, grouped_names, inject
from sve.layers.member import ADAPTABLE_TYPES, MemberLayer, MemberLayoutError, member_layers
from sve.layers.shared_inputs import share_inputs
from sve.members import check_member_logits, repeat_batch, split_members
from sve.methods.heads import MemberHeads
from sve.methods.registry import register

log = logging.getLogger(__name__)


CPU_EVAL_EXAMPLES = 8  # members x batch per pass when members_at_once is auto (module docstring)


def parse_members_at_once(value) -> int | str | None:
    """``all`` (None), ``auto`` or a positive integer; anything else is an error naming the valid choices."""
    if value in (None, "all"):
        return None
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = 0
    if k < 1 or str(value).strip() != str(k):
        raise InputError(f"method.members_at_once={value!r} is not valid; choose 'all', 'auto' or a positive integer")
    return k


class EnsembleMethod(nn.Module):
    """Base class. A subclass sets its class attributes, stores its own settings, then calls ``adapt()``.

    Behaviour that differs between methods is a hook that a subclass overrides (``make_layer``,
    ``num_members``, ``member_features``, ``member_logits``, ``training_chunks``, ``check_training``,
    ``check_sharding``, ``after_fit``, ``on_train_epoch_end``, ``next_round``, ``constrain_``, ...), and
    members that are not M models trained side by side are a kind of method, a base class
    (``sve.methods.kinds``: samples of one model, epoch-end snapshots, a fit after training). The class
    attributes below are facts about a method that other code reads (each comment names why); the registry
    (``sve.methods.registry``) hands the kinds and facts read by method name to the rest of the package.
    Whatever ``after_fit`` builds (a Laplace posterior, snapshots in use) must live in the state dict
    (``get_extra_state``): checkpoints written after it carry it, and ``evaluate.py`` never refits.

    Args:
        members_at_once: ``all``, ``auto``, or how many members run per backbone pass (module docstring).
        target_modules: overrides the backbone's patterns.
        task: the run's dataset name; a backbone's pretrained head is reused only for its own task.
    """

    # Labels, read through the registry by the tables and the docs.
    display_name: str = ""  # the method's row label in the tables (the paper's name where it has one)
    # Other options of configs/method that build this class and are rows of their own (sve_lora_shared of SVELoRA),
    # by option: here, not in the option's YAML, whose every key enters each run's recorded config (resume).
    option_display_names: dict[str, str] = {}
    trains: str = ""  # what the optimiser updates, in words
    # What the members are: read by code that plans, merges or evaluates a method it did not build.
    fixed_ensemble_size: int | None = None  # single, svf: another ensemble_size is warned of; this one is recorded
    shared_head: bool = False  # one head for all members (samples, snapshots): the heads' count; wrap warns
    stochastic: bool = False  # members draw as they run (MC dropout): merge refuses; tests compare no member alone
    train_backbone: bool = False  # the backbone's own weights train: adapt()'s requires_grad_ (BatchEnsemble: option)
    equals_base_at_init: bool = True  # init noise off, every member computes the backbone: the tests hold it to it
    layer_types: tuple[type, ...] = ADAPTABLE_TYPES  # target module types make_layer accepts (sve.layers.inject)
    wrapping: str = "wrapping"  # what make_layer does, in the progress bar of a slow wrap (sve.layers.inject)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        register(cls)  # where the class is defined, as timm registers its models

    def __init__(
        self,
        backbone: Backbone,
        ensemble_size: int,
        num_classes: int,
        lr: float | None = None,
        members_at_once: int | str = "all",
        target_modules: list[str] | None = None,
        task: str | None = None,
    ):
        super().__init__()
        if isinstance(ensemble_size, bool) or not isinstance(ensemble_size, int) or ensemble_size < 1:
            raise InputError(f"ensemble_size must be a positive integer, got {ensemble_size!r}")
        if self.fixed_ensemble_size is not None and ensemble_size != self.fixed_ensemble_size:
            warnings.warn(
                f"{type(self).__name__} has {self.fixed_ensemble_size} member(s); ignoring "
                f"ensemble_size={ensemble_size} (results record ensemble_size={self.fixed_ensemble_size})",
                stacklevel=2,
            )
            ensemble_size = self.fixed_ensemble_size
        if isinstance(num_classes, bool) or not hasattr(type(num_classes), "__index__") or num_classes < 2:
            raise InputError(
                f"num_classes={num_classes!r} is not valid: the members are classifiers with a softmax "
                "over at least 2 classes"
            )
        self.backbone = backbone
        self.ensemble_size = ensemble_size
        self.num_classes = num_classes
        self.lr = lr  # method-specific learning rate (Appendix C.3); None uses the recipe's optimizer.lr
        self.members_at_once = parse_members_at_once(members_at_once)
        self.target_modules = as_patterns(target_modules) or list(backbone.target_modules)
        self.base_parameter_count = count_parameters(backbone)
        self.base_fingerprint = backbone.fingerprint()  # before any layer is wrapped (adapter files)
        self.heads = MemberHeads(1 if self.shared_head else ensemble_size, backbone.feature_dim, num_classes)
        self.head_init = "random"
        initial = backbone.initial_head(task, num_classes)
        if initial is not None:
            with torch.no_grad():
                self.heads.weight.copy_(initial[0].expand_as(self.heads.weight))
                self.heads.bias.copy_(initial[1].expand_as(self.heads.bias))
            self.head_init = f"pretrained ({type(backbone).__name__}, task {task})"
        self.wrapped: list[str] = []
        self.fallback: str | None = None  # the module that makes the members run one at a time, if any
        self.layout_known = False  # whether a probe of two members decided it (``probe_member_layout``)

    @property
    def head_pretrained(self) -> bool:
        """Every member's head starts from the backbone's own head: nothing in the heads tells members apart."""
        return self.head_init != "random"

    def warn_if_members_start_alike(self, noise_key: str, noise: float) -> None:
        """Members with pretrained heads and no init noise start as one model, see the same batches and stay
        identical (disagreement 0): say so, naming the key that makes them differ."""
        if noise == 0 and self.head_pretrained and self.ensemble_size > 1 and not self.shared_head:
            warnings.warn(
                f"{type(self).__name__}: the head is {self.head_init} and {noise_key}=0, so the "
                f"{self.ensemble_size} members start as one model, see the same batches and stay "
                f"identical; set {noise_key} > 0 (e.g. 0.01) for members that differ",
                stacklevel=3,
            )

    def check_training(self, epochs: int) -> None:
        """Refuses, before training, a schedule of ``epochs`` on which this method cannot build its members."""

    def check_sharding(self) -> None:
        """Refuses, before ``trainer=fsdp`` shards it (``sve.training.sharding``), a method that FSDP cannot shard."""

    # ----- the shared preparation ---------------------------------------------------------------------------
    def make_layer(self, layer: nn.Module) -> MemberLayer | None:
        """The member layer replacing a target layer; None (the default) wraps nothing."""
        return None

    def adapt(self) -> None:
        """Probe, set what trains, wrap the targets, count and log. Called at the end of a subclass __init__."""
        usage = self.backbone.probe_usage(self.layer_types)
        self.backbone.requires_grad_(self.train_backbone)
        if usage is not None:
            for p in usage.unused_parameters:  # no gradient would reach them (BERT's pooler, an LM's lm_head)
                p.requires_grad_(False)
            self.unused_parameter_count = sum(p.numel() for p in usage.unused_parameters)
        if type(self).make_layer is not EnsembleMethod.make_layer:
            # A model wrapped without target patterns (sve.wrap) has the backbone's defaults: every adaptable layer
            # on the feature path, of any type. They are resolved as ``all`` is, for this method's layer types, so
            # a method that adapts linears only (Bayes-LoRA (LA)) takes the linears of a CNN, not its convolutions.
            default = getattr(self.backbone, "targets_by_default", False) and self.target_modules == list(
                self.backbone.target_modules
            )
            every = self.target_modules == [ALL] or default
            if every:  # every layer this method adapts, as exact names
                self.target_modules = every_layer(
                    self.backbone.model, self.layer_types, usage.unused_modules if usage is not None else None
                )
            self.wrapped = inject(
                self.backbone.model,
                self.target_modules,
                self.make_layer,
                types=self.layer_types,
                outside=usage.unused_modules if usage is not None else None,
                progress=f"{type(self).__name__}: {self.wrapping} the target layers",
            )
            if every:
                log.info(
                    "%s: %s takes %d layers: %s",
                    type(self).__name__,
                    "the default target_modules" if default else "target_modules=all",
                    len(self.wrapped),
                    ", ".join(self.wrapped),
                )
            self.probe_member_layout()
        self.log_summary()

    def probe_member_layout(self, batch: dict | None = None) -> None:
        """Decides, once and before any pass stacks members, whether they may be stacked member-major: a
        member layer whose owner calls it time-major ((T, N, D): XLNet's feed-forward, a ``batch_first=False``
        transformer) would mix them, one whose owner reads its ``.weight`` itself (``nn.MultiheadAttention``'s
        ``out_proj``, timm BEiT's and EVA's ``qkv``) cannot stack them. Two members run on one example, with
        one copy of it each and then with two: a time-major length can equal the rows of one pass, not of both
        (at run time it could equal a batch's rows, and the members would mix without a word). Such a layer
        makes the members run one at a time (``fall_back``); nothing else of the model changes (modes, random
        generators).

        Without ``batch`` (``adapt``) the probe input is the backbone's own; with it, the first example of a
        real batch, for methods whose layers had no two members when they were built (samples, snapshots)
        and for backbones without a probe input. Nothing is decided while no layer has two members."""
        layers = [layer for layer in self.member_layers() if layer.num_members() > 1]
        if self.layout_known or not layers:
            return
        if batch is None:
            batch = self.backbone.probe_batch() if self.members_at_once != 1 else None
            if batch is None or any(p.device.type == "meta" for p in layers[0].parameters()):
                return
            device = next(iter(layers[0].parameters())).device
            batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
            real = False
        else:
            batch, real = first_example(batch), True
        B, modes, generators = batch_size(batch), {m: m.training for m in self.modules()}, rng_states(batch)
        try:
            self.backbone.eval()
            with torch.enable_grad():  # training's (factored) paths: no merged weights kept
                for copies in (1, 2):
                    with self.select([0, 1], rows=2 * copies * B):
                        self.backbone(repeat_batch(batch, 2 * copies, batch_size=B))
            self.layout_known = True
        except MemberLayoutError as err:
            self.layout_known = True
            self.fall_back(err)
        except Exception as err:  # noqa: BLE001 - not the layout's: the real pass raises it where it belongs
            self.layout_known = real  # a real batch's probe is not asked again; the backbone's may be
            log.debug("%s: the member layout probe failed: %s: %s", type(self).__name__, type(err).__name__, err)
        finally:
            for module, mode in modes.items():
                module.training = mode
            restore_rng_states(generators)

    def stacks_members(self, batch: dict) -> bool:
        """Whether members may run stacked in one backbone pass on ``batch`` (probed once: ``probe_member_layout``)."""
        self.probe_member_layout(batch)
        return self.fallback is None

    def fall_back(self, err: MemberLayoutError) -> None:
        """From now on the members run one at a time, where a layer's input may have any layout; said once."""
        self.fallback = err.module or "a member layer"
        log.warning(
            "%s runs its members one at a time (%d backbone passes per batch, about %d times less "
            "activation memory): %s",
            type(self).__name__,
            self.ensemble_size,
            self.ensemble_size,
            err,
        )

    # ----- members --------------------------------------------------------------------------------------------
    def num_members(self) -> int:
        """Members (or samples, snapshots) that produce the output now; in eval mode, the predictive's."""
        return self.ensemble_size

    def member_layers(self) -> list[MemberLayer]:
        return member_layers(self.backbone)

    @contextmanager
    def select(self, members: list[int], rows: int | None = None) -> Iterator[None]:
        """Runs only ``members`` inside the context (every member layer selects them); with ``rows``, the rows
        (K members x B examples) of the member-major batch that every layer's input then has."""
        with ExitStack() as stack:
            for layer in self.member_layers():
                stack.enter_context(layer.select(members))
                if rows is not None:
                    stack.enter_context(layer.expect_rows(rows))
            yield

    @contextmanager
    def expect_rows(self, rows: int) -> Iterator[None]:
        """Inside: every member layer's input has ``rows`` rows, members as they are (BLoB's samples)."""
        with ExitStack() as stack:
            for layer in self.member_layers():
                stack.enter_context(layer.expect_rows(rows))
            yield

    def member_features(self, batch: dict, members: list[int]) -> Tensor:
        """Features (K, B, D) of ``members``: the batch stacked K times member-major, one backbone pass."""
        K, B = len(members), batch_size(batch)
        with self.select(members, rows=K * B):
            return split_members(self.backbone(repeat_batch(batch, K, batch_size=B)), K)

    def member_logits(self, batch: dict, members: list[int]) -> Tensor:
        return self.heads(self.member_features(batch, members), members)  # (K, B, C)

    def members_per_pass(self, batch: dict, members: int) -> int:
        """How many of ``members`` run in one backbone pass on this batch (``members_at_once``); one where the
        members cannot be stacked (``stacks_members``, asked here before any pass runs)."""
        if self.members_at_once != "auto":
            k = self.members_at_once or members
        elif self.training or self.heads.weight.device.type != "cpu":
            k = members
        else:
            k = min(members, max(1, CPU_EVAL_EXAMPLES // max(1, batch_size(batch))))
        return k if min(k, members) == 1 or self.stacks_members(batch) else 1

    def training_chunks(self, members_at_once: int | str | None = None) -> list[list[int]] | None:
        """The member chunks one training step runs and back-propagates one after another (``members_at_once:
        k``; the argument asks what another setting would give), or None: all members in one pass (and one
        backward). The step is the one all members at once take when members are independent passes of
        ``member_logits`` and the loss is their mean; a method whose members share one pass (a last-layer
        ensemble) or that trains them otherwise (a deep ensemble's rounds) returns None."""
        M = self.num_members()
        k = 1 if self.fallback else self.members_at_once if members_at_once is None else members_at_once
        if not isinstance(k, int) or k >= M:
            return None
        return [list(range(i, min(i + k, M))) for i in range(0, M, k)]

    def chunk_logits(self, batch: dict, members: list[int]) -> Tensor:
        """Logits (K, B, C) of ``members`` alone, as ``forward`` gives them for those members (one at a time
        where members cannot be stacked, as in ``forward``)."""
        if len(members) > 1 and self.stacks_members(batch):
            logits = self.member_logits(batch, members)
        else:
            logits = self.logits_in_passes(batch, members, 1)
        return check_member_logits(mask_choices(logits, batch), len(members))

    def forward(self, batch: dict) -> Tensor:
        members = list(range(self.num_members()))
        logits = self.logits_in_passes(batch, members, self.members_per_pass(batch, len(members)))
        return check_member_logits(mask_choices(logits, batch), len(members))

    def logits_in_passes(self, batch: dict, members: list[int], chunk: int) -> Tensor:
        """Logits (K, B, C) of ``members``, ``chunk`` members per backbone pass."""
        # One member per pass: the member-free layers that read the batch (a stem, embeddings) run once.
        shared = share_inputs(self.backbone, batch) if chunk == 1 and len(members) > 1 else nullcontext()
        with shared:
            return torch.cat([self.member_logits(batch, members[i : i + chunk]) for i in range(0, len(members), chunk)])

    @torch.no_grad()
    def predict(self, batch: dict, aggregate: str = "probs"):
        """The ensemble's prediction for ``batch`` with its per-example uncertainty (``sve.metrics.Prediction``:
        probabilities, class, confidence, entropy, expected entropy, mutual information, member disagreement),
        in evaluation mode; the method's training mode is left as it was."""
        from sve.metrics.scores import uncertainty

        was_training = self.training
        self.eval()
        try:
            return uncertainty(self(batch), aggregate)
        finally:
            self.train(was_training)

    # ----- hooks for methods that do more than train jointly (all optional) -----------------------------------
    def on_train_epoch_end(self, module) -> None:
        """Called by the LightningModule after every training epoch (e.g. to snapshot a checkpoint)."""

    def after_fit(self, datamodule) -> None:
        """Called by ``run`` after training, before testing (e.g. to fit a Laplace approximation)."""

    def next_round(self) -> bool:
        """After each fit: True asks ``run`` for another, with a fresh trainer (a sequential deep ensemble's rounds)."""
        return False

    def report(self) -> dict:
        """Facts for results.json; subclasses add their own to this."""
        return {
            "wrapped_modules": len(self.wrapped),
            "members_at_once": "all" if self.members_at_once is None else self.members_at_once,
            "fell_back_to_one_member_at_a_time": self.fallback,
            "head_init": self.head_init,
        }

    def loss(self, member_logits: Tensor, labels: Tensor, ensemble_size: int | None = None) -> Tensor:
        """Eq. 6: the mean over members of each member's cross-entropy. With ``ensemble_size`` (training in
        chunks), these K members' share of the mean over that many: the chunks' losses add up to the loss of
        all members at once, and their gradients to its gradient, rounding included (a sum divided by M B,
        as the mean divides)."""
        K, B, C = member_logits.shape
        logits, targets = member_logits.reshape(K * B, C).float(), labels.repeat(K)
        if ensemble_size is None:
            return F.cross_entropy(logits, targets)
        return F.cross_entropy(logits, targets, reduction="sum") / (ensemble_size * B)

    def constrain_(self) -> None:
        """Called after every optimiser step (e.g. to keep singular values non-negative)."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def parameter_groups(self) -> list[dict]:
        """The optimiser's groups: one at the method's rate, unless some tensors train at their own (named ``lr``)."""
        return [{"params": self.trainable_parameters()}]

    def parameter_counts(self) -> dict[str, int]:
        """Trainable, total, and backbone parameter counts (shared tensors counted once)."""
        seen: set[int] = set()
        total = trainable = 0
        for p in self.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            trainable += p.numel() if p.requires_grad else 0
        return {"trainable": trainable, "total": total}

    def log_summary(self) -> None:
        counts = self.parameter_counts()
        base = self.base_parameter_count
        if self.wrapped:
            # Grouped by block index: a 7B model's 224 names on one line read as noise (the full list is at debug).
            log.info("%s wrapped %d modules: %s", type(self).__name__, len(self.wrapped), grouped_names(self.wrapped))
            log.debug("wrapped modules: %s", ", ".join(self.wrapped))
        log.info(
            "%s: %s trainable parameters (%.2f%% of the backbone's %s)",
            type(self).__name__,
            f"{counts['trainable']:,}",
            100 * counts["trainable"] / max(base, 1),
            f"{base:,}",
        )


def batch_size(batch: dict) -> int:
    if "labels" in batch:
        return batch["labels"].shape[0]
    return next(v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.dim() > 0)  # not a 0-d scale


def first_example(batch: dict) -> dict:
    """The batch's first example: each tensor whose leading dimension is the batch's, cut to one row."""
    B = batch_size(batch)
    return {k: v[:1] if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == B else v for k, v in batch.items()}


def mask_choices(logits: Tensor, batch: dict) -> Tensor:
    """Sets the logits of absent answer options to -inf when a batch has ``choice_mask`` (B, C) (multiple
    choice with a varying number of options, e.g. ARC's 3 to 5)."""
    mask = batch.get("choice_mask")
    if mask is None:
        return logits
    return logits.masked_fill(~mask.bool().unsqueeze(0), float("-inf"))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
