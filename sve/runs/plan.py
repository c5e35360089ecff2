"""``sve-train ... plan=true``: the memory a run would take on each device, for training and for evaluation,
without training and without downloading anything.

The configured backbone is built on fake tensors (``torch._subclasses.FakeTensorMode``: shapes, dtypes and
devices, no storage), so a 7B model costs no memory and no weights are read; an SVD of a fake weight returns
fake factors of the right shapes. A Hugging Face backbone needs only its architecture: its config.json from
a local directory or the local Hugging Face cache, else the copy shipped in ``sve.runs.architectures`` for
the paper's backbones; timm backbones build from code. The method then wraps the backbone exactly as a run
does, and one training step (forward, backward, optimiser step) and one evaluation forward run on fake
inputs of the configured shape (``dataset.batch_size`` per device, ``dataset.max_length`` tokens or the
backbone's image size) under the configured precision, while ``LiveMemory`` adds up the bytes of every tensor
storage alive (rounded to the CUDA allocator's 512-byte blocks) and keeps the peak.

What is exact and what is an estimate (the plan prints it beside each number):

- *exact*: parameter and buffer bytes (frozen weights, SVE's factors U and V, sve_top's residual W_res,
  trainable parameters), their gradients and the optimiser state (counted after the step), the merged-weight
  cache of evaluation (counted after the forward), and how FSDP shards them;
- *estimate*: activations and the peaks. They count every tensor the step creates, as the step does, but
  not the allocator's fragmentation, the CUDA context (about 0.3-0.5 GiB per process), kernel workspaces
  (cuBLAS, attention) or memory held by the data loader. On fake tensors the Hugging Face attention mask
  is always materialised (a real all-ones mask may be skipped), which adds (B, 1, T, T) booleans. The
  validation test (tests/runs/test_plan.py) compares the peaks with measured ones on the CPU.

Per device: a single device holds everything; DDP the same plus its gradient buckets (a copy of every
trainable gradient: Lightning leaves ``gradient_as_bucket_view`` off); FSDP (``trainer=fsdp``,
``sve.training.sharding``) shards parameters, gradients and optimiser state over ``trainer.devices`` and
gathers the root unit (embeddings, heads) and two blocks (the one running and the next, prefetched) at a
time, one unit per repeated block of the backbone as ``sharding`` wraps them. Activations are per device in
every case, for the device's share of the batch.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode, unset_fake_temporarily

from sve.errors import InputError
from sve.layers.recompute import disable_checkpointing, enable_checkpointing, is_checkpointing
from sve.runs.architectures import offline_backbone
from sve.runs.layout import CUDA_CONTEXT, GIB, PRECISIONS, Layout, device_layout, gib
from sve.runs.live_memory import BLOCK, LiveMemory, tensor_bytes

log = logging.getLogger(__name__)

OPTION_TOKENS = 32  # cloze scoring: tokens planned per option text (ARC's options are a few words)


# ----- the plan -----------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """Bytes per device. ``stored`` holds the exact parameter bytes by kind; ``train`` and ``eval`` the step's
    numbers; ``alternatives`` the training peaks measured with one setting changed (name -> bytes)."""

    title: str
    layout: Layout
    capacity: int
    stored: dict[str, int]
    train: dict[str, int]
    eval: dict[str, int]
    alternatives: dict[str, dict[str, int]]
    per_device: dict[str, int]
    notes: list[str]
    unit: int = 0  # bytes FSDP gathers at once: the root unit and two blocks
    sv_shapes: list[tuple[int, int, int]] = field(default_factory=list)  # (out, in', factor bytes) per SV layer

    @property
    def train_peak(self) -> int:
        return self.per_device["train_peak"]

    @property
    def eval_peak(self) -> int:
        return self.per_device["eval_peak"]

    @property
    def fits(self) -> bool:
        return max(self.train_peak, self.eval_peak) <= self.capacity


def plan(cfg: DictConfig, capacity_gib: float | None = None, alternatives: bool = True) -> Plan:
    """The memory plan of the run ``cfg`` describes (module docstring). ``capacity_gib``: the device memory to
    check against (default ``plan_memory_gib`` of the config; the CPU: this machine's memory)."""
    from sve.layers.draws import unfuse_attention_dropout
    from sve.layers.member import member_layers
    from sve.runs.run import instantiate

    layout = device_layout(cfg)
    capacity = device_capacity(cfg, layout, capacity_gib)
    block = BLOCK if layout.device == "cuda" else 1  # the CUDA caching allocator's rounding; none on the CPU
    # Fake CPU tensors whatever the device: autograd's engine needs a real CUDA context for CUDA tensors, fake
    # or not. The step then runs CPU kernels (and CPU autocast), whose outputs have the same sizes. (CPU is
    # the default device: a ``torch.device`` context around FakeTensorMode crashed torch 2.14 here.)
    # The class count before fake tensors: a dataset that reads its classes from its files (image_folder,
    # text_table, unless dataset.num_classes says it) reads them with real tensors.
    datamodule = instantiate(cfg.dataset)
    num_classes = datamodule.num_classes
    check_member_count(int(cfg.ensemble_size), int(getattr(datamodule, "eval_batch_size", 1)), num_classes, capacity)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        backbone = build_backbone(OmegaConf.create(offline_backbone(cfg.backbone)), fake, instantiate)
        datamodule.attach(backbone)
        method_node = OmegaConf.create(OmegaConf.to_container(cfg.method, resolve=True))
        if "svd_cache" in method_node:
            method_node.svd_cache = None  # the cache hashes weight values, which fake weights do not have
        method = instantiate(
            method_node,
            backbone=backbone,
            ensemble_size=int(cfg.ensemble_size),
            num_classes=num_classes,
            task=cfg.dataset.name,
        )
        # As the LightningModule does with exact_draws (sve.layers.draws): attention with dropout runs
        # unfused, and the step keeps its probabilities as the run's does. (The module itself is not built:
        # its torchmetrics states on fake tensors corrupted the heap now and then, torch 2.14.)
        if bool(cfg.get("exact_draws", True)):
            unfuse_attention_dropout(method.backbone)
        if is_checkpointing(backbone.model):
            checkpointing(backbone.model, True)  # the same checkpointing, without stashing fake RNG states
        how = PRECISIONS[layout.precision]
        if how is not None and how[0] == "cast":
            method.to(how[1])
        stored = stored_bytes(method, block)
        resident = sum(stored.values())
        per_device_batch = -(-int(cfg.dataset.batch_size) // (layout.devices * layout.accumulate))
        batch = example_batch(datamodule, backbone, per_device_batch)
        factory = optimizer_factory(cfg, method)
        clip = OmegaConf.select(cfg, "trainer.gradient_clip_val", default=None)
        train = train_step(method, batch, factory, how, clip, block)
        others = alternative_steps(method, batch, factory, how, clip, block) if alternatives else {}
        if hasattr(method, "planned_free_memory"):  # SVE: cache merged weights when they fit half of what is free
            method.planned_free_memory = max(capacity - resident, 0)
        eval_batch = example_batch(datamodule, backbone, int(getattr(datamodule, "eval_batch_size", per_device_batch)))
        if layout.device != "cpu" and method.members_at_once == "auto":
            method.members_at_once = None  # auto runs every member at once on an accelerator (the fake tensors
            # are CPU tensors, on which auto would evaluate a few examples per pass)
        evaluation = eval_step(method, eval_batch, how, block)
        unit, root = fsdp_units(method, block)
    notes = list(layout.notes)
    from sve.methods.base import EnsembleMethod

    if type(method).after_fit is not EnsembleMethod.after_fit:
        notes.append(
            f"{type(method).__name__} builds something after training (after_fit: a posterior, snapshots); "
            "its memory is not planned"
        )
    M = int(cfg.ensemble_size)
    title = (
        f"{cfg.backbone.name} + {cfg.method.name} (ensemble_size {M}) on {cfg.dataset.name}: {layout.devices} "
        f"device(s) ({layout.device}, {layout.strategy}), precision {layout.precision}, batch "
        f"{per_device_batch} per device ({cfg.dataset.batch_size} global), "
        f"{input_shape(batch)}"
    )
    unit = root + 2 * unit  # gathered at once: the root unit and two blocks (the one running, the next prefetched)
    per_device = device_share(stored, train, evaluation, layout, unit)
    notes += (
        [
            f"FSDP: parameters, gradients and optimiser state sharded over {layout.devices} devices, plus the "
            f"root unit and two blocks gathered ({gib(unit)} GiB)"
        ]
        if layout.strategy == "fsdp"
        else []
    )
    shapes = [
        (layer.out_features, layer.in_features, layer.U.element_size())
        for layer in member_layers(method)
        if isinstance(getattr(layer, "U", None), Tensor) and getattr(layer, "residual", None) is None
    ]
    return Plan(title, layout, capacity, stored, train, evaluation, others, per_device, notes, unit, shapes)


def check_member_count(M: int, rows: int, num_classes: int, capacity: int) -> None:
    """Refuses, before anything is built, an ensemble whose member logits of one evaluation batch, (M, rows, C)
    in float32 as the evaluator keeps them, alone exceed the device memory: no run of it can exist, and building
    it (lists of M member indices, M heads) would take as long as M is large."""
    need = M * rows * num_classes * 4
    if need > capacity:
        raise InputError(
            f"ensemble_size={M} cannot run in {gib(capacity)} GiB: the member logits of one evaluation "
            f"batch ({M} x {rows} x {num_classes} float32) alone take {gib(need)} GiB; at most "
            f"{capacity // (rows * num_classes * 4)} members fit that, fewer with the model"
        )


def build_backbone(node: DictConfig, fake: FakeTensorMode, instantiate) -> nn.Module:
    """The backbone on fake tensors. One whose construction reads values (timm's ViTs turn a linspace of
    drop-path rates into floats) is built with real random weights first, which must fit in host memory (the
    paper's ViTs take 90 MB), and its tensors are then made fake."""
    try:
        return instantiate(node)
    except Exception as err:  # noqa: BLE001 - hydra wraps what the constructor raised
        if not reads_values(err):
            raise
    with unset_fake_temporarily():
        backbone = instantiate(node)
    for module in backbone.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = nn.Parameter(fake.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake.from_tensor(b)
    return backbone


def reads_values(err: BaseException | None) -> bool:
    """Whether ``err`` (or what caused it) is a fake tensor's refusal to give a value."""
    while err is not None:
        if isinstance(err, DataDependentOutputException):
            return True
        err = err.__cause__ or err.__context__
    return False


def device_capacity(cfg: DictConfig, layout: Layout, capacity_gib: float | None) -> int:
    value = capacity_gib if capacity_gib is not None else cfg.get("plan_memory_gib", 24)
    if layout.device == "cpu" and capacity_gib is None:
        from sve.memory import free_memory

        return free_memory("cpu")
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise InputError(
            f"plan_memory_gib={cfg.get('plan_memory_gib')!r} is not valid; expected the device memory "
            "in GiB, a positive number (e.g. 24 for an RTX 4090)"
        )
    return int(value * GIB)


def stored_bytes(method: nn.Module, block: int = 1) -> dict[str, int]:
    """Exact bytes of parameters and buffers by kind (each storage once)."""
    from sve.layers.member import member_layers

    factors, residual = [], []
    for layer in member_layers(method):
        factors += [t for t in (getattr(layer, "U", None), getattr(layer, "Vh", None)) if isinstance(t, Tensor)]
        if isinstance(getattr(layer, "residual", None), Tensor):
            residual.append(layer.residual)
    special = {id(t) for t in factors + residual}
    params = list(dict.fromkeys(method.parameters()))
    out = {
        "frozen weights": tensor_bytes(
            [p for p in params if not p.requires_grad and id(p) not in special] + list(method.buffers()), block
        ),
        "factors (U, V)": tensor_bytes(factors, block),
        "residual W_res": tensor_bytes(residual, block),
        "trainable parameters": tensor_bytes([p for p in params if p.requires_grad], block),
    }
    return {k: v for k, v in out.items() if v or k in ("frozen weights", "trainable parameters")}


def example_batch(datamodule, backbone, rows: int) -> dict:
    """A batch of ``rows`` examples shaped as the data module's collate makes them, at the longest length."""
    labels = torch.zeros(rows, dtype=torch.long)
    if backbone.modality == "image":
        size = int(backbone.image_size)
        return {"pixel_values": torch.zeros(rows, 3, size, size), "labels": labels}
    T = int(getattr(datamodule, "max_length", 128))
    scoring = getattr(datamodule, "scoring", None)
    C = int(datamodule.num_classes)
    if scoring == "cloze":
        L = min(OPTION_TOKENS, T // 2)
        return {
            "input_ids": torch.zeros(rows, T - L, dtype=torch.long),
            "attention_mask": torch.ones(rows, T - L, dtype=torch.long),
            "option_ids": torch.zeros(rows, C, L, dtype=torch.long),
            "option_mask": torch.ones(rows, C, L, dtype=torch.long),
            "labels": labels,
            "choice_mask": torch.ones(rows, C, dtype=torch.bool),
        }
    batch = {
        "input_ids": torch.zeros(rows, T, dtype=torch.long),
        "attention_mask": torch.ones(rows, T, dtype=torch.long),
        "labels": labels,
    }
    if scoring is not None:
        batch["choice_mask"] = torch.ones(rows, C, dtype=torch.bool)
    return batch


def input_shape(batch: dict) -> str:
    if "pixel_values" in batch:
        return f"images {batch['pixel_values'].shape[-1]} px"
    tokens = batch["input_ids"].shape[1] + (batch["option_ids"].shape[-1] if "option_ids" in batch else 0)
    return f"sequence length {tokens}"


def optimizer_factory(cfg: DictConfig, method):
    """A function making the configured optimiser over the trainable parameters, as the module does."""
    import hydra

    partial = hydra.utils.instantiate(cfg.optimizer)
    extra = {"lr": method.lr} if getattr(method, "lr", None) is not None else {}
    return lambda: partial(method.trainable_parameters(), **extra)


def autocast(how):
    return torch.autocast("cpu", dtype=how[1]) if how is not None and how[0] == "autocast" else nullcontext()


def train_step(method, batch: dict, factory, how, clip, block: int = 1) -> dict[str, int]:
    """One training step on fake tensors: bytes of activations (alive at the end of the forward), gradients,
    optimiser state, and the peaks beyond the stored parameters of the forward and backward and of the
    optimiser step. Members run in chunks where the method trains them so (``training_chunks``)."""
    method.train()
    optimizer = factory()
    tracker = LiveMemory(block)
    labels = batch["labels"]
    with tracker:
        chunks = method.training_chunks() if hasattr(method, "training_chunks") else None
        activations = 0
        with autocast(how):
            if chunks is None:
                loss = method.loss(method(batch), labels)
                activations = tracker.live
            else:
                M = sum(len(c) for c in chunks)
                # Two chunks hold what every later one does (the same shapes; the gradients exist from the
                # first on), so the rest are not run: a 7B model's sixteen chunks would take minutes here.
                for members in chunks[:2]:
                    before = tracker.live
                    loss = method.loss(method.chunk_logits(batch, members), labels, ensemble_size=M)
                    activations = max(activations, tracker.live - before)
                    # Inside the chunk's selection: gradient checkpointing recomputes the layers in the
                    # backward, and they must run this chunk's members there too.
                    with method.select(members):
                        loss.backward()
                    del loss
        if chunks is None:
            loss.backward()
            del loss
        forward_backward = tracker.peak
        trainable = method.trainable_parameters()
        gradients = tensor_bytes([p.grad for p in trainable if p.grad is not None], block)
        tracker.reset_peak()
        if clip:
            torch.nn.utils.clip_grad_norm_(trainable, float(clip))
        optimizer.step()
        state = tensor_bytes([t for s in optimizer.state.values() for t in s.values()], block)
        optimizer.zero_grad(set_to_none=True)
        step = tracker.peak
    return {
        "activations": activations,
        "gradients": gradients,
        "optimizer state": state,
        "forward_backward_peak": forward_backward,
        "step_peak": step,
    }


def train_peak(train: dict[str, int]) -> int:
    """The most a step holds beyond the stored parameters once the optimiser state exists (every step after
    the first): the forward and backward with that state resident, or the optimiser step itself."""
    return max(train["forward_backward_peak"] + train["optimizer state"], train["step_peak"])


def alternative_steps(method, batch: dict, factory, how, clip, block: int = 1) -> dict[str, dict[str, int]]:
    """The training step again with gradient checkpointing switched (Hugging Face backbones) and with one
    member per pass (methods that train in chunks); each restored afterwards."""
    out = {}
    model = method.backbone.model
    if getattr(model, "supports_gradient_checkpointing", False):
        on = is_checkpointing(model)
        checkpointing(model, not on)
        try:
            name = f"backbone.gradient_checkpointing={str(not on).lower()}"
            out[name] = train_step(method, batch, factory, how, clip, block)
        finally:
            checkpointing(model, on)
    chunk = method.training_chunks() if hasattr(method, "training_chunks") else None
    if method.num_members() > 1 and method.training_chunks(1) is not None and (chunk is None or len(chunk[0]) > 1):
        previous, method.members_at_once = method.members_at_once, 1
        try:
            out["method.members_at_once=1"] = train_step(method, batch, factory, how, clip, block)
        finally:
            method.members_at_once = previous
    return out


def checkpointing(model: nn.Module, on: bool) -> None:
    """Gradient checkpointing of a Hugging Face model on or off, as ``HFBackbone`` sets it, except that the
    random state is not stashed for the recomputation: a fake tensor cannot be restored as one (and the
    dropout masks it would repeat cost no memory)."""
    if on:
        enable_checkpointing(model, preserve_rng_state=False)
    else:
        disable_checkpointing(model)


def eval_step(method, batch: dict, how, block: int = 1) -> dict[str, int]:
    """One evaluation forward on fake tensors: the merged-weight cache it builds and its peak beyond the
    stored parameters."""
    from sve.layers.member import member_layers

    method.eval()
    tracker = LiveMemory(block)
    batch = {k: v for k, v in batch.items()}
    method.logits_in_passes = two_passes(method)
    try:
        with tracker, torch.no_grad(), autocast(how):
            logits = method(batch)
            cache = sum(layer.cache_bytes() for layer in member_layers(method) if hasattr(layer, "cache_bytes"))
            del logits
    finally:
        del method.logits_in_passes
        method.train()
    return {"merged cache": cache, "peak": tracker.peak}


def two_passes(method):
    """``method.logits_in_passes`` that runs only its first two backbone passes: every later pass holds what the
    second does (the same shapes; a merged-weight cache is built for all members in the first), so the plan of
    a million members on the CPU, one member per pass, takes two passes, not a million. The logits the other
    passes would have kept are allocated (empty) after the first, so the second pass peaks as the last would."""
    from sve.layers.shared_inputs import share_inputs

    whole = method.logits_in_passes

    def passes(batch: dict, members: list[int], chunk: int) -> Tensor:
        if len(members) <= 2 * chunk:
            return whole(batch, members, chunk)
        with share_inputs(method.backbone, batch) if chunk == 1 else nullcontext():  # as logits_in_passes
            first = method.member_logits(batch, members[:chunk])  # (K, B, C)
            rest = first.new_empty((len(members) - 2 * chunk, *first.shape[1:]))
            return torch.cat([first, rest, method.member_logits(batch, members[chunk : 2 * chunk])])

    return passes


def fsdp_units(method: nn.Module, block: int = 1) -> tuple[int, int]:
    """(largest block, root) parameter bytes of the units ``trainer=fsdp`` wraps (``sve.training.sharding``):
    one unit per repeated block of the backbone, the rest of the method (embeddings, heads) the root unit."""
    from sve.training.sharding import repeated_blocks

    kinds = tuple(repeated_blocks(method.backbone.model))
    blocks = [m for m in method.modules() if kinds and isinstance(m, kinds)]
    inside = {id(p) for b in blocks for p in b.parameters()}
    root = tensor_bytes([p for p in method.parameters() if id(p) not in inside], block)
    return max((tensor_bytes(b.parameters(), block) for b in blocks), default=0), root


def device_share(
    stored: dict[str, int], train: dict[str, int], evaluation: dict[str, int], layout: Layout, unit: int
) -> dict[str, int]:
    """Bytes on each device: what is stored, trained and gathered there under the layout's strategy."""
    N = layout.devices if layout.strategy == "fsdp" else 1
    resident = sum(stored.values())
    sharded = -(-resident // N)
    gathered = min(unit, resident) if layout.strategy == "fsdp" else 0
    grads, state = -(-train["gradients"] // N), -(-train["optimizer state"] // N)
    buckets = train["gradients"] if layout.strategy == "ddp" else 0
    # Peaks measured on one device with everything replicated; under FSDP the gradients and the state are
    # a shard each, so the replicated parts of the peaks are replaced by their shards.
    fb = train["forward_backward_peak"] - train["gradients"] + grads
    step = train["step_peak"] - train["gradients"] - train["optimizer state"] + grads + state
    peak = max(fb + state, step)
    context = CUDA_CONTEXT if layout.device == "cuda" else 0
    return {
        "stored": sharded,
        "gathered": gathered,
        "gradients": grads,
        "optimizer state": state,
        "ddp buckets": buckets,
        "context": context,
        "train_peak": context + sharded + gathered + buckets + peak,
        "eval_peak": context + sharded + gathered + evaluation["peak"],
    }


__all__ = ["Plan", "plan", "train_peak", "device_share"]
