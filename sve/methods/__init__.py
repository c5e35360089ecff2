"""Methods: each wraps a backbone and returns member logits (M, B, C); see ``sve.members``."""

from sve.methods.base import EnsembleMethod, MemberHeads
from sve.methods.batch_ensemble import BatchEnsemble
from sve.methods.bayes_lora import BayesLoRA, BayesLoRALA, BayesLoRALLLA
from sve.methods.blob import BLoB
from sve.methods.checkpoint import CheckpointEnsemble
from sve.methods.deep_ensemble import DeepEnsemble, DeepEnsembleLoRA
from sve.methods.last_layer import LastLayerEnsemble
from sve.methods.lora import LoRAEnsemble, SingleLoRA
from sve.methods.mc_dropout import MCDropout, MCDropoutLoRA
from sve.methods.single import Single
from sve.methods.sve import SVE, SVF
from sve.methods.sve_lora import SVELoRA
from sve.methods.sve_top import SVETop

__all__ = [
    "EnsembleMethod", "MemberHeads", "Single", "SVE", "SVF", "SingleLoRA", "LoRAEnsemble", "MCDropout",
    "MCDropoutLoRA", "DeepEnsemble", "DeepEnsembleLoRA", "BatchEnsemble", "BayesLoRA", "BayesLoRALLLA",
    "BayesLoRALA", "BLoB", "LastLayerEnsemble", "CheckpointEnsemble", "SVELoRA", "SVETop",
]
