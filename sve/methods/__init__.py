"""Methods: each wraps a backbone and returns member logits (M, B, C); see ``sve.members``."""

from sve.methods.base import EnsembleMethod, MemberHeads
from sve.methods.single import Single
from sve.methods.sve import SVE, SVF

__all__ = ["EnsembleMethod", "MemberHeads", "Single", "SVE", "SVF"]
