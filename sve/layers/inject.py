"""Replace target layers of a backbone with member layers (SV layers, LoRA, BatchEnsemble, ...).

Following peft: the names to replace are collected first, then each module is swapped through its parent,
so the tree is never mutated while it is being iterated. A pattern is a regular expression that must match
a whole dot-separated suffix of the module name: ``query`` matches ``encoder.layer.0.attention.self.query``
but not ``encoder.layer.0.attention.self.query_proj``; ``attn\\.(qkv|proj)`` matches ``blocks.3.attn.qkv``.
Only the layer types given (by default nn.Linear and Hugging Face Conv1D) are candidates, so ``proj`` does
not catch timm's Conv2d ``patch_embed.proj``.

Heads are never adapted. They are found structurally: the backbone's probe (``Backbone.probe_usage``) runs
one small input and keeps only the layers whose output reaches the features; classifiers, ``lm_head``, a
pooler whose output is not used, distillation heads are all outside that path, whatever their names. Where
no probe is possible (a bare ``nn.Module``), every module inside a sub-tree named like a head
(``classifier.dense``, ``lm_head.dense``, ``pre_classifier``, ...) is protected instead.

Every pattern must match at least one adaptable layer; otherwise the error names the pattern, says whether
it matched only heads, and lists the candidates.

A wrap that takes more than ``PROGRESS_DELAY`` seconds (SVE decomposing every target layer of a large model)
shows a progress bar on stderr, layers done out of the targets, with its estimate of the time left.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Collection, Sequence

from torch import nn

from sve.errors import InputError
from sve.layers.member import ADAPTABLE_TYPES, CONV_TYPES, Conv1D, MemberLayer

log = logging.getLogger(__name__)

LINEAR_TYPES: tuple[type, ...] = (nn.Linear,) + ((Conv1D,) if Conv1D else ())

# Name components of head sub-trees, used only when the structural probe is not available.
HEAD_COMPONENTS = re.compile(r"^(head|heads|head_dist|classifier|pre_classifier|lm_head|score|pooler|fc|linear)$")

ALL = "all"  # target_modules: all — every layer the method can adapt on the way to the features


def as_patterns(value) -> list[str] | None:
    """``target_modules`` as a list: a bare string (``backbone.target_modules=query`` on the command line) is
    one pattern, not its characters; None stays None (the backbone's patterns apply)."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def adaptable(module: nn.Module) -> bool:
    """A layer every member layer can stand in for: a linear (or HF Conv1D), or a plain ``nn.Conv1d``, ``Conv2d``
    or ``Conv3d`` with groups = 1 and zero padding (``padding="same"`` and ``"valid"`` included; depthwise and
    padding-in-forward convolutions are not)."""
    if isinstance(module, MemberLayer) or not isinstance(module, ADAPTABLE_TYPES):
        return False
    if isinstance(module, CONV_TYPES):
        own_forward = type(module).forward not in {conv.forward for conv in CONV_TYPES}
        return module.groups == 1 and module.padding_mode == "zeros" and not own_forward
    return True


def every_layer(model: nn.Module, types: tuple[type, ...], outside: Collection[str] | None) -> list[str]:
    """``target_modules: all`` resolved: an exact pattern (``^name``) for every layer of ``types`` that a member
    layer can stand in for, heads and layers outside the feature path excluded (``is_head``)."""
    names = [
        n for n, m in model.named_modules() if n and isinstance(m, types) and adaptable(m) and not is_head(n, outside)
    ]
    if not names:
        raise InputError(
            f"{type(model).__name__} has no layer of the types this method adapts "
            f"({[t.__name__ for t in types]}) on the way to its features (target_modules=all, or "
            "sve.wrap's default targets); choose a method that adapts the layers it has"
        )
    return [f"^{re.escape(n)}" for n in names]


def _compile(patterns: Sequence[str] | str) -> list[tuple[str, re.Pattern]]:
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns:
        raise InputError("no target patterns given (target_modules is empty)")
    compiled = []
    for p in patterns:
        if not isinstance(p, str):
            raise InputError(
                f"target pattern {p!r} is a {type(p).__name__}; patterns are strings (regular expressions)"
            )
        try:
            compiled.append((p, re.compile(rf"(?:^|\.)(?:{p})$")))
        except re.error as err:
            raise InputError(f"target pattern {p!r} is not a valid regular expression: {err}") from err
    return compiled


def is_head(name: str, outside: Collection[str] | None) -> bool:
    """A module outside the feature path (structural), or, without a probe, inside a head-named sub-tree."""
    if outside is not None:
        return name in outside
    return any(HEAD_COMPONENTS.match(part) for part in name.split("."))


def find_targets(
    model: nn.Module,
    patterns: Sequence[str] | str,
    types: tuple[type, ...] = LINEAR_TYPES,
    outside: Collection[str] | None = None,
) -> list[str]:
    """Names of modules of ``types`` matching a pattern, heads excluded; every pattern must match one.

    Args:
        outside: names (relative to ``model``) of the layers whose output does not reach the features, from
            ``Backbone.probe_usage``; None protects head-named sub-trees instead.
    """
    compiled = _compile(patterns)
    candidates = [n for n, m in model.named_modules() if n and isinstance(m, types) and not isinstance(m, MemberLayer)]
    heads = {n for n in candidates if is_head(n, outside)}
    names, unmatched = [], []
    for pattern, regex in compiled:
        hits = [n for n in candidates if regex.search(n)]
        if not [n for n in hits if n not in heads]:
            unmatched.append((pattern, hits))
        names += [n for n in hits if n not in heads and n not in names]
    if unmatched:
        shown = [n for n in candidates if n not in heads]
        listing = ", ".join(shown[:12]) + (f" ... ({len(shown)} in all)" if len(shown) > 12 else "")
        # A pattern that names a layer of another type (a convolution, for a method that adapts linears only)
        # says so: "matched no module" would send the user looking for a typo.
        others = {
            n: type(m).__name__
            for n, m in model.named_modules()
            if n and not isinstance(m, types) and isinstance(getattr(m, "weight", None), nn.Parameter)
        }
        regexes = dict(compiled)

        def problem(pattern: str, hits: list[str]) -> str:
            if hits:
                return (
                    f"{pattern!r} matched only heads or layers outside the feature path ({', '.join(hits[:4])}), "
                    "which are never adapted"
                )
            typed = [f"{n} ({t})" for n, t in others.items() if regexes[pattern].search(n)]
            if typed:
                return f"{pattern!r} matched {', '.join(typed[:2])}, not a type this method adapts"
            inside = [
                c for c in candidates if any(regexes[pattern].search(c[:i]) for i in range(len(c)) if c[i] == ".")
            ]
            if inside:  # a block's name: the pattern must reach the layers themselves (module docstring)
                return (
                    f"{pattern!r} matched only blocks that hold layers ({', '.join(inside[:2])}, ...); a pattern "
                    f"matches the end of a layer's own name: '{pattern}\\..*' takes every layer in "
                    "them"
                )
            return f"{pattern!r} matched no module"

        problems = [problem(p, hits) for p, hits in unmatched]
        patterns_shown = [p for p, _ in compiled]
        raise InputError(  # a config's (or a wrap call's) patterns: a user error, one line from the CLI
            f"target patterns {patterns_shown[:6]}{f' ... ({len(patterns_shown)} in all)' if len(compiled) > 6 else ''}"
            f" (types: {[t.__name__ for t in types]}): {'; '.join(problems[:4])}"
            f"{f'; ... ({len(problems)} patterns in all)' if len(problems) > 4 else ''}. "
            f"Adaptable modules are: {listing or 'none'}. Name the layers to adapt with target_modules (regular "
            "expressions; on the command line backbone.target_modules=[...])"
        )
    order = {n: i for i, n in enumerate(candidates)}
    return sorted(names, key=order.__getitem__)


# Seconds before a wrap's progress bar appears: a wrap that ends sooner says nothing (the test sets 0).
PROGRESS_DELAY = 2.0


def inject(
    model: nn.Module,
    patterns: Sequence[str] | str,
    factory: Callable[[nn.Module], nn.Module],
    types: tuple[type, ...] = LINEAR_TYPES,
    outside: Collection[str] | None = None,
    progress: str | None = None,
) -> list[str]:
    """Replaces every target module ``m`` by ``factory(m)`` in place; returns the replaced names. ``progress``:
    the description of the progress bar a slow wrap shows (module docstring); None shows none."""
    from tqdm.auto import tqdm

    names = find_targets(model, patterns, types, outside)
    # On stderr whether or not it is a terminal, as the package's other bars (a notebook's is not one either);
    # left on screen once shown: it says where the time before training went. TQDM_DISABLE=1 hides it (tqdm
    # reads the variable for an argument not given).
    hidden = {} if progress is not None else {"disable": True}
    bar = tqdm(names, desc=progress, unit="layer", delay=PROGRESS_DELAY, file=sys.stderr, dynamic_ncols=True, **hidden)
    for name in bar:
        base = model.get_submodule(name)
        layer = factory(base)
        if isinstance(layer, MemberLayer):
            layer.module_name = name  # errors name the module
        # A module registered under several names (one layer applied at two places) is listed once, under its
        # first name; every place that holds it gets the member layer, or the others would stay the base layer.
        places = [(parent, child) for parent in model.modules() for child, m in parent._modules.items() if m is base]
        for parent, child in places:
            setattr(parent, child, layer)
        if len(places) > 1:
            log.info(
                "layer %s is registered at %d places; one member layer stands in at all of them", name, len(places)
            )
    log.debug("wrapped %d modules: %s", len(names), ", ".join(names))
    return names


def grouped_names(names: list[str]) -> str:
    """Module names with their numeric path parts collapsed, in first-seen order: ``layers.0.q``,
    ``layers.1.q`` become ``layers.{0..1}.q (2)``; a name with no sibling stays as it is."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in names:
        groups.setdefault(tuple("*" if p.isdigit() else p for p in name.split(".")), []).append(name)
    out = []
    for shape, members in groups.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        columns = iter(zip(*([int(p) for p in m.split(".") if p.isdigit()] for m in members)))  # per numeric part
        parts = [p if p != "*" else index_set(sorted(set(next(columns)))) for p in shape]
        out.append(f"{'.'.join(parts)} ({len(members)})")
    return ", ".join(out)


def index_set(values: list[int]) -> str:
    """``{0..31}`` for a run of consecutive indices, ``{0,2,5}`` otherwise, the index itself when one."""
    if len(values) == 1:
        return str(values[0])
    if values == list(range(values[0], values[-1] + 1)):
        return f"{{{values[0]}..{values[-1]}}}"
    return "{" + ",".join(map(str, values)) + "}"
