"""``singular_values.npz``: each SV layer's pretrained and trained per-member singular values (Appendix B).

One file per run, in the run directory, written after training. For every module with the attributes
``pretrained_singular_values`` (r,) and ``singular_values`` (M, r) (``sve.layers.SVLinear``, ``SVConv``),
two arrays keyed by the module's dotted name:

- ``<name>.pretrained``: (r,) float32, the singular values of the pretrained weight, descending;
- ``<name>.members``: (M, r) float32, member m's trained singular values in the same order.

Figs. 4-6 plot ``100 * (members - pretrained) / pretrained`` for the largest values (``sve.paper.figures``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

FILENAME = "singular_values.npz"


def singular_value_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    arrays = {}
    for name, layer in module.named_modules():
        if hasattr(layer, "pretrained_singular_values") and hasattr(layer, "singular_values"):
            arrays[f"{name}.pretrained"] = layer.pretrained_singular_values.detach().float().cpu().numpy()
            arrays[f"{name}.members"] = layer.singular_values.detach().float().cpu().numpy()
    return arrays


def movement(module: nn.Module) -> dict[str, float] | None:
    """How far training moved the singular values, over every SV layer's values at once (None without SV
    layers): ``member_spread``, the members' RMS distance from their mean relative to the mean's norm
    (sqrt(mean_m ||S_m - mean||^2) / ||mean||: about ``sigma_init`` at init, so a spread still near it says the
    members differ only by their initial noise), and ``mean_shift``, ||mean - pretrained|| / ||pretrained||."""
    # Sums of squares layer by layer (a 7B model at M = 16 has some 15M values: no concatenated copy of them).
    spread = mean_norm = shift = pretrained_norm = 0.0
    found = False
    for layer in module.modules():
        if not (hasattr(layer, "pretrained_singular_values") and hasattr(layer, "singular_values")):
            continue
        found = True
        members = layer.singular_values.detach().double()  # (M, r)
        pretrained = layer.pretrained_singular_values.detach().double()
        mean = members.mean(0)
        spread += float(((members - mean) ** 2).sum(1).mean())
        mean_norm += float((mean**2).sum())
        shift += float(((mean - pretrained) ** 2).sum())
        pretrained_norm += float((pretrained**2).sum())
    if not found:
        return None
    return {"member_spread": (spread / mean_norm) ** 0.5, "mean_shift": (shift / pretrained_norm) ** 0.5}


def save_singular_values(method: nn.Module, run_dir: str | Path) -> Path | None:
    """Writes ``run_dir/singular_values.npz``; None (and no file) when the method has no SV layers."""
    arrays = singular_value_arrays(method)
    if not arrays:
        return None
    path = Path(run_dir) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def load_singular_values(path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{layer name: (pretrained (r,), members (M, r))} from a ``singular_values.npz``."""
    with np.load(path) as data:
        names = [key.removesuffix(".pretrained") for key in data.files if key.endswith(".pretrained")]
        return {name: (data[f"{name}.pretrained"], data[f"{name}.members"]) for name in names}
