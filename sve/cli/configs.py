"""What the command line knows about the configs without composing a run or importing torch: the config groups
and their options (read from the config folders), ``train.yaml``'s keys with the first sentence of their
comment, and Hydra's composition errors turned into one line with "did you mean".

Hydra answers ``method=sev`` with "Could not find 'method/sev'" and its search path, and ``dataset.roots=x``
with "Key 'roots' is not in struct ... To append use +dataset.roots", which points at the wrong fix (a key
added with + is one nothing reads). ``compose_error`` names the value, the closest option or key, and the valid
ones instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from sve.errors import InputError, did_you_mean
from sve.paths import CONFIGS

# Folders of sve/configs that are not config groups of a run: the table and claim definitions (sve-sweep,
# sve-tables, the bootstrap) and the paper's numbers. Hydra lists them as groups; a run composes none of them.
NOT_RUN_GROUPS = {
    "tables": "table and figure definitions (sve-sweep, sve-tables)",
    "claims": "the paper's claims (checked against the miniature)",
    "paper": "the paper's numbers (csv)",
}


def module_doc(name: str) -> str:
    """The docstring of the module ``name``, read from its file without importing it (and torch with it)."""
    import ast
    import importlib.util

    # find_spec of a submodule would import its packages (sve.bench's __init__ imports torch): found by path.
    top, *rest = name.split(".")
    path = Path(importlib.util.find_spec(top).submodule_search_locations[0]).joinpath(*rest)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def search_dirs(config_dir: str | None = None, searchpath: list[str] = ()) -> list[Path]:
    """The config folders a run's groups are looked up in: the package's, ``--config-dir`` and the ``file://``
    entries of ``hydra.searchpath`` (``pkg://`` entries are packages, whose folders are not listed here)."""
    dirs = [CONFIGS]
    if config_dir:
        dirs.append(Path(config_dir).expanduser())
    for entry in searchpath:
        entry = str(entry)
        if entry.startswith("file://"):
            dirs.append(Path(entry.removeprefix("file://")).expanduser())
        elif "://" not in entry:
            dirs.append(Path(entry).expanduser())
    return [d for d in dirs if d.is_dir()]


def groups(dirs: list[Path] = (CONFIGS,)) -> dict[str, list[str]]:
    """``{group: [options]}`` of every folder holding ``*.yaml`` files (nested groups as ``hydra/launcher``),
    merged over ``dirs``; the folders of ``NOT_RUN_GROUPS`` left out."""
    found: dict[str, set[str]] = {}
    for root in dirs:
        for path in root.rglob("*.yaml"):
            group = path.parent.relative_to(root).as_posix()
            if group != "." and group.split("/")[0] not in NOT_RUN_GROUPS:
                found.setdefault(group, set()).add(path.stem)
    return {group: sorted(options) for group, options in sorted(found.items())}


def main_keys(path: Path = CONFIGS / "train.yaml") -> list[tuple[str, str, str]]:
    """(key, default, description) for each top-level key of ``path`` but ``defaults``, ``hydra`` and ``paths``
    (set by Hydra): the description is the key's inline comment, else the first sentence of the comment above
    it; a key with nested keys shows them as its default (``predictions.save=true ...``)."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    keys, comment = [], []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            comment.append(line.lstrip("# ").strip())
            continue
        match = re.match(r"([A-Za-z_]\w*):[^#]*(?:#\s*(.*))?$", line)
        if match and match.group(1) not in ("defaults", "hydra", "paths"):
            key, inline = match.group(1), match.group(2)
            value = values[key]
            shown = {f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
            default = " ".join(f"{k}={yaml_value(v)}" for k, v in shown.items())
            keys.append((key, default, inline or first_sentence(" ".join(comment))))
        if not line.startswith(" "):
            comment = []
    return keys


def yaml_value(value) -> str:
    """A value as it is written on the command line (``null``, ``true``)."""
    return (
        {None: "null", True: "true", False: "false"}.get(value, value)
        if not isinstance(value, float | int) or isinstance(value, bool)
        else str(value)
    )


def first_sentence(text: str) -> str:
    """Up to the first full stop outside parentheses that ends a sentence (``(Eq. 5)``, ``e.g.`` do not)."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if (
            char == "."
            and depth == 0
            and (i + 1 == len(text) or text[i + 1] == " ")
            and not text[max(0, i - 3) : i + 1].endswith(("e.g.", "i.e."))
        ):
            return text[: i + 1]
    return text


def shortened(text: str, width: int) -> str:
    """``text`` within ``width`` characters: without its parentheses, then up to a clause's end."""
    if len(text) > width:
        text = re.sub(r"\s*\([^()]*\)", "", text)
    if len(text) > width:
        cut = max(text.rfind("; ", 0, width), text.rfind(", ", 0, width - 4), text.rfind(": ", 0, width))
        text = text[: cut if cut > width // 3 else text.rfind(" ", 0, width - 4)].rstrip(",;: ") + " ..."
    return text


def option_error(group: str, value: str, options: list[str]) -> InputError:
    return InputError(
        f"{group}={value}: no such option{did_you_mean(value, options)}; the options of {group} "
        f"are: {', '.join(options)}"
    )


def check_group_values(overrides: list[str], dirs: list[Path]) -> None:
    """Each value that an override gives a config group (every value of a sweep, ``method=sve,sev``) is one of
    the group's options; what composing cannot show before a multirun's first job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    known = groups(dirs)
    for override in OverridesParser.create().parse_overrides(overrides):
        group = override.key_or_group
        if group not in known or override.is_delete():
            continue
        values = (
            [str(v) for v in override.sweep_string_iterator()] if override.is_sweep_override() else [override.value()]
        )
        for value in values:
            if value is not None and str(value) not in known[group] and str(value) != "null":
                raise option_error(group, value, known[group])


def compose_error(err: BaseException, dirs: list[Path] = (CONFIGS,), keys=None) -> InputError | None:
    """One line for Hydra's error ``err`` when it is an unknown option of a group, an unknown group or an
    unknown key (not in the struct); None for any other error. ``keys``: the config's top-level keys, for an
    unknown top-level key."""
    from hydra.errors import MissingConfigException

    known = groups(dirs)
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in str(err.missing_cfg_file):
        group, _, value = str(err.missing_cfg_file).rpartition("/")
        return option_error(group, value, list(err.options or known.get(group, [])))
    text = str(err)
    unknown_group = re.match(r"Could not override '([^']+)'\. No match in the defaults list", text)
    if unknown_group:
        name = unknown_group.group(1)
        return InputError(
            f"{name}: no such config group{did_you_mean(name, known)}; the groups are: "
            f"{', '.join(g for g in known if not g.startswith('hydra/'))}"
        )
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    if full_key and "is not in struct" in str(cause):
        parent = getattr(cause, "parent_node", None)
        valid = [str(k) for k in (parent.keys() if parent is not None else keys or []) if k != "hydra"]
        where = full_key.rpartition(".")[0] or "the top level"
        return InputError(
            f"{full_key}: no such key{did_you_mean(full_key.rpartition('.')[2], valid)}; {where} "
            f"has: {', '.join(valid)}"
        )
    return None


def defaults(path: Path = CONFIGS / "train.yaml") -> dict[str, str]:
    """``{group: default option}`` of ``path``'s defaults list."""
    from omegaconf import OmegaConf

    found = {}
    for entry in OmegaConf.load(path).get("defaults", []):
        if isinstance(entry, dict) or OmegaConf.is_dict(entry):
            for group, option in entry.items():
                found[str(group).removeprefix("override ").split("@")[0]] = str(option).replace("None", "null")
    return found


def groups_help(dirs: list[Path] = (CONFIGS,), leave_out: tuple[str, ...] = (), with_defaults: bool = True) -> str:
    """One line per config group: its options and (``with_defaults``) train.yaml's choice."""
    default = defaults() if with_defaults else {}
    lines = []
    for group, options in groups(dirs).items():
        if group not in leave_out:
            shown = f" (default {default[group]})" if group in default else ""
            lines.append(f"  {group}{shown}: {', '.join(options)}")
    return "\n".join(lines)


def keys_help(width: int = 118) -> str:
    """One line per top-level key of train.yaml: key=default and its description, within ``width``."""
    keys = main_keys()
    pad = max(len(default) for _, default, _ in keys if len(default) <= 28) + 4
    lines = []
    for _, default, text in keys:
        head = f"  {default}"
        head = f"{head:<{pad}}" if len(head) < pad else head + "  "
        lines.append(head + shortened(text, width - len(head)))
    return "\n".join(lines)
