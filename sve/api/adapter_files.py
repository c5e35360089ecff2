"""Adapter files: what training changed, apart from the frozen base it was trained on (as peft's adapters).

A directory holds:

- ``adapter_model.safetensors``: every trainable tensor of the method (singular values, member biases, heads,
  LoRA factors; every weight for the full fine-tunes), by its name in the method's state dict; or, written with
  ``max_shard_bytes`` and larger than that, shards ``adapter_model-00001-of-0000N.safetensors`` of at most that
  size each and an index ``adapter_model.safetensors.index.json`` ({"metadata": {"total_size"}, "weight_map":
  {tensor: file}}, Hugging Face's layout), so that a repository that takes no large file keeps a run's adapter;
- ``extra_state.pt`` (only for methods that have one): what ``after_fit`` built (a Laplace posterior, a
  checkpoint ensemble's snapshots), plain types only, read with ``weights_only=True``;
- ``adapter_config.json``: the method, its settings, the member count, how the features are read, the shapes
  of the example input (with its masks and the positions of its special tokens: a probe of zeros is not valid
  for every model; never the text's own tokens), ``base_fingerprint``: a hash of the frozen base (below), and
  ``calibration``: the temperature ``Ensemble.calibrate`` fitted (``sve.api.calibration``; null, or absent in
  files written before it, for an uncalibrated ensemble), and ``conformal``: the set threshold
  ``Ensemble.conformalize`` fitted with its score, alpha, options and predictive (``sve.api.conformal``; null or
  absent likewise).

Not written: the base weights and what follows from them, U, V and the pretrained singular values, which
``from_pretrained`` recomputes (or reads from the SVD cache, ``svd_cache=...``). So a file is about the size
of the trainable parameters, and it is only meaningful on the base it was trained on: the fingerprint
(``sve.backbones.base.fingerprint``) hashes every tensor's name, dtype, shape and bytes, taken before any layer
is wrapped (the head aside), and ``from_pretrained`` refuses a base whose fingerprint differs, before any SVD.
Files of version 1 recorded a fingerprint of 1,024 sampled values per tensor: they are still read, checked
against that sampled fingerprint, with a warning that a base differing elsewhere would pass (saving the
ensemble again writes version 2).

Hub sharing: ``save_pretrained(dir, push_to_hub=True, repo_id=...)`` uploads the directory with
``huggingface_hub`` and ``from_pretrained(model, "<user>/<repo>")`` downloads it, when that package is installed
(a clear error when it is not; offline, ``HF_HUB_OFFLINE=1`` reads Hugging Face's local cache only).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from sve.errors import InputError

ADAPTER = "adapter"  # a run's adapter directory, beside its results.json
CONFIG = "adapter_config.json"
TENSORS = "adapter_model.safetensors"
INDEX = "adapter_model.safetensors.index.json"
SHARD = "adapter_model-{:05d}-of-{:05d}.safetensors"
HEADER_ROOM = 64 * 1024  # bytes kept free in each shard for the safetensors header (names, shapes, offsets)
EXTRA = "extra_state.pt"
FORMAT = "sve-adapter"
VERSION = 2  # 2: the fingerprint hashes every value; 1: a sample of each tensor (module docstring)
READABLE_VERSIONS = (1, 2)


def trained_state(method: nn.Module) -> tuple[dict[str, Tensor], dict]:
    """(trainable tensors by state-dict name, extra states by name) of ``method``."""
    tensors, extra = {}, {}
    for name, value in method.state_dict(keep_vars=True).items():
        if name.endswith("_extra_state"):
            if value:
                extra[name] = value
        elif isinstance(value, nn.Parameter) and value.requires_grad:
            tensors[name] = value.detach().cpu().contiguous().clone()  # safetensors refuses shared storage
    return tensors, extra


def shards(tensors: dict[str, Tensor], max_shard_bytes: int) -> list[dict[str, Tensor]]:
    """``tensors`` in state-dict order, packed into groups whose data fits ``max_shard_bytes`` with room for the
    header (a tensor larger than that is a group of its own)."""
    room = max(max_shard_bytes - HEADER_ROOM, 1)
    groups, size = [{}], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > room:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    return groups


def write_tensors(tensors: dict[str, Tensor], directory: Path, max_shard_bytes: int | None) -> None:
    """One safetensors file, or shards and their index when ``max_shard_bytes`` is given and exceeded; the files
    of an earlier write in the other layout are removed, so a directory never holds both."""
    from safetensors.torch import save_file

    for old in [directory / TENSORS, directory / INDEX, *directory.glob("adapter_model-*-of-*.safetensors")]:
        old.unlink(missing_ok=True)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if max_shard_bytes is None or total + HEADER_ROOM <= max_shard_bytes:
        save_file(tensors, str(directory / TENSORS))
        return
    groups = shards(tensors, max_shard_bytes)
    weight_map = {}
    for i, group in enumerate(groups, 1):
        name = SHARD.format(i, len(groups))
        save_file(group, str(directory / name))
        weight_map.update(dict.fromkeys(group, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def write_adapter(method: nn.Module, directory: str | Path, config: dict, max_shard_bytes: int | None = None) -> Path:
    """Writes the three files (module docstring); ``config`` is recorded with the format and fingerprint.
    ``max_shard_bytes``: the largest tensor file to write (None: one file, whatever its size)."""
    directory = Path(directory).expanduser()
    tensors, extra = trained_state(method)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_tensors(tensors, directory, max_shard_bytes)
    except Exception as err:  # safetensors' own error for a read-only place names neither directory nor remedy
        if not (isinstance(err, OSError) or type(err).__name__ == "SafetensorError"):
            raise
        raise InputError(
            f"the adapter directory {directory} cannot be written ({type(err).__name__}: {err}); save to a "
            "writable directory instead, or make this one writable"
        ) from None
    if extra:
        torch.save(extra, directory / EXTRA)
    elif (directory / EXTRA).exists():
        (directory / EXTRA).unlink()
    record = {
        "format": FORMAT,
        "version": VERSION,
        **config,
        "base_fingerprint": method.base_fingerprint,
        "tensors": len(tensors),
        "trainable_parameters": sum(t.numel() for t in tensors.values()),
    }
    (directory / CONFIG).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return directory


def read_config(directory: str | Path) -> dict:
    path = Path(directory).expanduser() / CONFIG
    if not path.is_file():
        raise InputError(
            f"{directory}: no {CONFIG}; an adapter directory holds {CONFIG} and {TENSORS} "
            "(written by save_pretrained, or by every run under <run dir>/adapter)"
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{path} is not valid JSON ({err})") from err
    if config.get("format") != FORMAT or config.get("version") not in READABLE_VERSIONS:
        raise InputError(
            f"{path} is not an SVE adapter config of a version this SVE reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}): format {config.get('format')!r}, version "
            f"{config.get('version')!r}"
        )
    return config


def check_fingerprint(config: dict, actual: str, directory) -> None:
    """Refuses a base whose fingerprint is not the one ``config`` recorded; ``actual`` is the base's
    ``Fingerprint`` (a file of version 1 is checked against its ``sampled`` form, module docstring)."""
    saved = config.get("base_fingerprint")
    if config.get("version") == 1:
        warnings.warn(
            f"the adapter in {directory} was written by an SVE whose fingerprint of the base sampled "
            "1,024 values per tensor: a base that differs elsewhere is not detected; save the ensemble "
            "again to record the fingerprint of every value",
            stacklevel=3,
        )
        actual = getattr(actual, "sampled", actual)
    if saved != actual:
        raise InputError(
            f"the adapter in {directory} was trained on another base model: its base fingerprint is "
            f"{str(saved)[:12]}..., this model's is {actual[:12]}... (names, shapes or weights "
            "differ); load it on the model it was trained on, with the same head and pooling"
        )


def read_trained_state(directory: str | Path) -> tuple[dict[str, Tensor], dict]:
    """(tensors, extra states) of an adapter directory; a file that is missing or cannot be read (a copy or
    download cut short) is an error naming it."""
    from safetensors.torch import load_file

    directory = Path(directory).expanduser()
    if (directory / TENSORS).is_file() or not (directory / INDEX).is_file():
        files = [directory / TENSORS]
    else:
        index = json.loads((directory / INDEX).read_text())
        files = [directory / name for name in sorted(set(index.get("weight_map", {}).values()))]
    tensors = {}
    for path in files:
        if not path.is_file():
            raise InputError(
                f"{path}: no such file; an adapter directory holds {CONFIG} and {TENSORS} (or its shards and "
                f"{INDEX}), written together by save_pretrained: copy or download the whole directory"
            )
        try:
            tensors.update(load_file(str(path)))
        except Exception as err:  # safetensors' own error type, or an OSError: the file is damaged either way
            raise InputError(
                f"{path} is not a readable safetensors file ({type(err).__name__}: {err}); it is "
                "truncated or damaged: copy or download the adapter directory again"
            ) from err
    extra = {}
    if (directory / EXTRA).exists():
        try:
            extra = torch.load(directory / EXTRA, weights_only=True)
        except Exception as err:
            raise InputError(
                f"{directory / EXTRA} cannot be read ({type(err).__name__}: {err}); it is truncated "
                "or damaged: copy or download the adapter directory again"
            ) from err
    return tensors, extra


def load_trained_state(
    method: nn.Module, directory: str | Path, trained: tuple[dict[str, Tensor], dict] | None = None
) -> None:
    """Loads the adapter's tensors (and extra state) into ``method``, from ``trained`` when it was read
    already (``read_trained_state``); every trainable tensor must be in the file and every tensor of the file
    must be one of them, with its shape."""
    tensors, extra = trained if trained is not None else read_trained_state(directory)
    expected, _ = trained_state(method)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = [
        f"{k}: file {tuple(tensors[k].shape)}, model {tuple(expected[k].shape)}"
        for k in set(tensors) & set(expected)
        if tensors[k].shape != expected[k].shape
    ]
    if missing or unexpected or shapes:
        raise InputError(
            f"the adapter in {directory} does not fit this method: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, shapes {shapes[:5]}"
        )
    state = method.state_dict()
    state.update({k: v.to(state[k].dtype) for k, v in tensors.items()})
    state.update(extra)
    method.load_state_dict(state)


# ----- the Hub ------------------------------------------------------------------------------------------------------
def hub():
    try:
        import huggingface_hub
    except ImportError as err:  # pragma: no cover - a dependency of transformers
        raise ImportError("sharing adapters on the Hub needs huggingface_hub: pip install huggingface_hub") from err
    return huggingface_hub


def push(directory: Path, repo_id: str, private: bool = False) -> str:
    api = hub().HfApi()
    api.create_repo(repo_id, exist_ok=True, private=private)
    api.upload_folder(repo_id=repo_id, folder_path=str(directory))
    return repo_id


def locate(name_or_path: str | Path) -> Path:
    """A local adapter directory, or a Hub repo id downloaded (or read from the local Hub cache)."""
    path = Path(name_or_path).expanduser()
    if path.exists() or str(name_or_path).startswith(("/", ".", "~")) or str(name_or_path).count("/") != 1:
        if not path.is_dir():
            raise InputError(f"{name_or_path}: no adapter directory there (nor a Hub repo id <user>/<repo>)")
        return path
    return Path(hub().snapshot_download(repo_id=str(name_or_path)))


# ----- the ensemble of ``sve.wrap`` ----------------------------------------------------------------------------------
# Integer example tensors up to this size keep their structure in the config (below); larger ones only their shape.
MAX_RECORDED_VALUES = 4096
SPECIAL_TOKEN_KEYS = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "cls_token_id",
    "decoder_start_token_id",
)


def special_token_ids(model) -> set[int]:
    """The token ids a Hugging Face model's config names as special (``SPECIAL_TOKEN_KEYS``; a list of end ids
    counts each); empty for a model without such a config."""
    config = getattr(model, "config", None)
    ids: set[int] = set()
    for key in SPECIAL_TOKEN_KEYS:
        value = getattr(config, key, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                ids.add(v)
    return ids


def example_spec(batch: dict, model=None) -> dict:
    """The shapes and dtypes of the example input, to rebuild a valid one. A probe of zeros is not valid for
    every model: BART's and T5's classifiers read the features at the end-of-sequence token and refuse ids with
    none. So integer tensors also keep their *structure*: masks and token types as they are, token ids with
    every id the model's config names special (``special_token_ids``) in place and every other id replaced by
    one filler id. The example is the user's data, and an adapter file is made to be shared: the text's own
    tokens are never written. Floating-point inputs (pixels, audio) are taken as zeros: any values probe them."""
    special = special_token_ids(model)
    filler = min(set(range(len(special) + 1)) - special)  # the smallest id that is not special
    spec = {}
    for k, v in batch.items():
        if not isinstance(v, Tensor):
            continue
        spec[k] = {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
        if v.is_floating_point() or v.is_complex() or v.numel() > MAX_RECORDED_VALUES:
            continue
        values = v.detach().cpu().flatten().tolist()
        if not (k.endswith("mask") or k == "token_type_ids"):  # ids: the special tokens' positions only
            values = [x if x in special else filler for x in values]
        spec[k]["values"] = values
    return spec


def example_from_spec(spec: dict):
    from sve.api.module_backbone import from_batch

    batch = {}
    for k, v in spec.items():
        dtype = getattr(torch, v["dtype"])
        values = v.get("values")
        batch[k] = (
            torch.tensor(values, dtype=dtype).reshape(v["shape"])
            if values is not None
            else torch.zeros(v["shape"], dtype=dtype)
        )
    if "attention_mask" in batch and "values" not in spec["attention_mask"]:  # a config written before the values
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    args, kwargs = from_batch(batch)
    return kwargs if not args else (tuple(args) if len(args) > 1 else args[0])


def save_adapter(
    ensemble, directory: str | Path, push_to_hub: bool = False, repo_id: str | None = None, private: bool = False
) -> Path:
    from sve import __version__

    backbone = ensemble.method.backbone
    config = {
        **ensemble.config,
        "sve_version": __version__,
        "example_input": (
            example_spec(backbone.probe_batch(), backbone.model) if hasattr(backbone, "example") else None
        ),
        "backbone": type(backbone).__name__,
        "calibration": ensemble.calibration,  # the fitted temperature (sve.api.calibration), null before
        "conformal": ensemble.conformal,  # the fitted set threshold (sve.api.conformal), null before
    }
    directory = write_adapter(ensemble.method, directory, config)
    if push_to_hub:
        if not repo_id:
            raise ValueError("push_to_hub=True needs repo_id='<user>/<repo>'")
        push(directory, repo_id, private)
    return directory
