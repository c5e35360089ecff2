"""Before torch is imported: would this run have to download something that this machine cannot reach?

Importing torch, Lightning and timm takes seconds, and the loaders notice missing weights or data only after
it. Offline, ``sve-train method=sve dataset=flowers102`` should answer at once, naming every source it lacks
and the key that replaces each. The check reads only the config and the local caches, and it is conservative:
it names a source only when that source is certainly not on disk (no local path, nothing in the cache it
would be read from). Anything it cannot decide without the libraries is left to the loaders, which check
again and fail fast on their own (``sve.offline``).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.errors import InputError, OfflineError
from sve.offline import endpoint_answers, hub_reachable
from sve.paths import cache_root, missing_file, xdg_cache

LOCAL = ("~", "/", ".")  # a name_or_path starting so is a local directory, never a Hub id


def hf_home() -> Path:
    """``HF_HOME``, else ``huggingface`` in the user's cache (``$XDG_CACHE_HOME``), as huggingface_hub has it."""
    return Path(os.environ["HF_HOME"]).expanduser() if os.environ.get("HF_HOME") else xdg_cache("huggingface")


def hub_cache() -> Path:
    """The Hugging Face Hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``), as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return hf_home() / "hub"


def datasets_cache() -> Path:
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    return hf_home() / "datasets"


def has_entries(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def network_reachable(timeout: float = 5.0) -> bool:
    """Whether the internet answers at all (the Hub's host, whatever ``HF_HUB_OFFLINE`` says): the probe for
    downloads that are not from the Hub, such as torchvision's."""
    return endpoint_answers(timeout)


def hub_model_cached(repo_id: str) -> bool:
    """Some snapshot of the Hub model ``repo_id`` is in the cache (its files are checked by the loader)."""
    return has_entries(hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots")


def timm_weights_cached(model_name: str) -> bool:
    """timm reads its weights from the Hub as ``timm/<model_name>``; without a tag it picks one, so any tag
    counts. A few timm weights come from plain URLs into torch's hub cache, whose file names cannot be told
    from the model name without timm: any file there counts as possibly these weights."""
    prefix = f"models--timm--{model_name}"
    cache = hub_cache()
    if cache.is_dir() and any(
        p.name == prefix or (p.name.startswith(prefix + ".") and "." not in model_name) for p in cache.iterdir()
    ):
        return True
    torch_home = Path(os.environ["TORCH_HOME"]).expanduser() if os.environ.get("TORCH_HOME") else xdg_cache("torch")
    torch_hub = torch_home / "hub" / "checkpoints"
    return has_entries(torch_hub)


def hub_dataset_cached(hub_name: str) -> bool:
    """Something under the name of the Hub dataset ``hub_name`` in the ``datasets`` or Hub caches (both spell
    an organisation differently, and a dataset may move to one: the last part of the name is matched)."""
    last = hub_name.split("/")[-1].lower()
    built = datasets_cache()
    if built.is_dir() and any(p.name.lower().split("___")[-1] == last for p in built.iterdir()):
        return True
    hub = hub_cache()
    return hub.is_dir() and any(
        p.name.lower().startswith("datasets--") and p.name.lower().split("--")[-1] == last for p in hub.iterdir()
    )


def backbone_needs(backbone: DictConfig) -> list[tuple[str, str, str, bool]]:
    """(what, where it would come from, what to set instead, whether from the Hub) for each backbone file not
    on disk."""
    get = lambda key: OmegaConf.select(backbone, key, default=None)  # noqa: E731
    what, needs = f"backbone {get('name')}", []
    name_or_path = get("name_or_path")
    if name_or_path:  # a Hugging Face model: its config (and weights, when pretrained) from a path or the Hub
        local = str(name_or_path).startswith(LOCAL)
        if local and not (Path(str(name_or_path)).expanduser() / "config.json").is_file():
            raise InputError(
                f"{what}: backbone.name_or_path={name_or_path} holds no config.json; expected a "
                "save_pretrained directory (config.json, weights, tokenizer files)"
            )
        if not local and not hub_model_cached(str(name_or_path)):
            needs.append(
                (
                    what,
                    f"the Hub model {name_or_path}",
                    "backbone.name_or_path=<a local save_pretrained directory>",
                    True,
                )
            )
        tokenizer = get("tokenizer")
        if (
            tokenizer
            and tokenizer != "char"
            and not str(tokenizer).startswith(LOCAL)
            and not hub_model_cached(str(tokenizer))
        ):
            needs.append((what, f"the Hub tokenizer {tokenizer}", "backbone.tokenizer=<a local directory>", True))
    elif get("model_name") and get("pretrained") and not get("checkpoint_path"):  # timm weights from the Hub
        if not timm_weights_cached(str(get("model_name"))):
            instead = "backbone.checkpoint_path=<a local weights file> or backbone.pretrained=false"
            needs.append((what, f"timm's pretrained weights of {get('model_name')}", instead, True))
    checkpoint = get("checkpoint_path")  # a local weights file, read when pretrained (not a pkg:// one)
    if checkpoint and get("pretrained") is not False and "://" not in str(checkpoint):
        if not Path(str(checkpoint)).expanduser().is_file():
            raise InputError(
                f"{what}: {missing_file('backbone.checkpoint_path', checkpoint, 'a weights file')}, "
                "or backbone.pretrained=false"
            )
    return needs


def dataset_needs(dataset: DictConfig) -> list[tuple[str, str, str, bool]]:
    """As ``backbone_needs``, for dataset files certainly not on disk."""
    get = lambda key: OmegaConf.select(dataset, key, default=None)  # noqa: E731
    what, root = f"dataset {get('name')}", get("root")
    if "download" in dataset:  # torchvision-style: files under root (or the cache), downloaded when missing
        # Where torchvision-style datasets are downloaded when dataset.root is null (sve.data.vision).
        path = Path(str(root)).expanduser() if root else cache_root("data", str(get("name")))
        if path.is_dir() and any(p.is_file() for p in path.rglob("*")):
            return []  # some files are there (a failed download leaves empty folders): the data module checks
        shown = f"dataset.root={root}" if root else f"dataset.root=null ({path})"
        if not get("download"):
            raise InputError(
                f"{what}: {shown} is empty or missing and dataset.download=false; set dataset.root "
                "to a local copy (docs/datasets-and-backbones.md gives its layout), or "
                "dataset.download=true"
            )
        return [(what, f"a download into {path}", "dataset.root=<a local copy>", False)]
    # A local copy that is not there at all is a typo whatever the dataset's layout: said here, before torch is
    # imported (the data module checks the layout of one that exists).
    if root and not Path(str(root)).expanduser().exists():
        raise InputError(
            f"{what}: dataset.root={root}: no such file or directory; set dataset.root to your local "
            "copy (docs/datasets-and-backbones.md gives its layout)"
            + ("" if not get("hub_name") else f", or dataset.root=null to load {get('hub_name')}")
        )
    if get("hub_name") and not root and not hub_dataset_cached(str(get("hub_name"))):
        return [(what, f"the Hub dataset {get('hub_name')}", "dataset.root=<a local copy>", True)]
    return []


def check_sources(cfg: DictConfig) -> None:
    """``OfflineError`` naming every source that is not on disk when the network does not answer, and what to
    set for each; nothing when everything is local or the network answers."""
    needs = backbone_needs(cfg.backbone) if "backbone" in cfg else []
    needs += dataset_needs(cfg.dataset) if "dataset" in cfg else []
    if not needs:
        return
    hub, other = [n for n in needs if n[3]], [n for n in needs if not n[3]]
    unreachable = (hub if hub and not hub_reachable() else []) + (other if other and not network_reachable() else [])
    if unreachable:
        listed = "; ".join(f"{what} needs {source} (or set {instead})" for what, source, instead, _ in unreachable)
        raise OfflineError(
            f"no network, and the run needs what is not on this machine: {listed}. "
            "docs/datasets-and-backbones.md gives each dataset's and backbone's local-path key "
            "and layout"
        )
