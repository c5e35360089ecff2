"""The library API: any method on a model the user already has (``wrap``), adapter files (``save_pretrained``,
``from_pretrained``), predictions with uncertainty (``Ensemble.predict``), calibrated (``Ensemble.calibrate``),
and members exported as plain models (``Ensemble.merge``)."""

from sve.api.module_backbone import ModuleBackbone
from sve.api.wrap import Ensemble, wrap


def from_pretrained(model, name_or_path, **overrides) -> Ensemble:
    """The ensemble saved in ``name_or_path`` (a directory or a Hub repo id) rebuilt on ``model``."""
    return Ensemble.from_pretrained(model, name_or_path, **overrides)


__all__ = ["Ensemble", "ModuleBackbone", "from_pretrained", "wrap"]
