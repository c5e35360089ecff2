"""The architectures of the paper's Hugging Face backbones, so that a memory plan (``sve.runs.plan``) can build
them without a download when their config.json is not in the local cache.

Each entry is the ``config.json`` of the checkpoint a backbone config names (``backbone.name_or_path``),
reduced to the keys that decide the parameter shapes and the computation; the weights are never needed for
a plan. The timm backbones (DINO, DINOv2, the random ViT, EfficientNet) build from timm's code and need
no entry here.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.errors import InputError

ARCHITECTURES: dict[str, dict] = {
    # LLaMA-2-7B (Touvron et al., 2023): 6,738,415,616 parameters with lm_head.
    "meta-llama/Llama-2-7b-hf": {
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "attention_bias": False,
        "mlp_bias": False,
    },
    # BERT-base-uncased (Devlin et al., 2019): 109,482,240 parameters with the pooler.
    "bert-base-uncased": {
        "model_type": "bert",
        "vocab_size": 30522,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "hidden_act": "gelu",
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "pad_token_id": 0,
    },
}


def architecture(name_or_path: str | None, key: str = "backbone") -> dict:
    """A Hugging Face config as keyword arguments of ``AutoConfig.for_model``: the local directory's
    config.json, the local Hugging Face cache's, or the copy in ``sve.runs.architectures``; never a download."""
    if name_or_path:
        path = Path(str(name_or_path)).expanduser()
        if (path / "config.json").exists():
            return json.loads((path / "config.json").read_text())
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(name_or_path), "config.json")
        except Exception:  # noqa: BLE001 - not a hub id (a missing local path, say): no cache entry
            cached = None
        if isinstance(cached, str) and Path(cached).exists():
            return json.loads(Path(cached).read_text())
        if str(name_or_path) in ARCHITECTURES:
            return dict(ARCHITECTURES[str(name_or_path)])
    raise InputError(
        f"the plan cannot know the architecture of {key}.name_or_path={name_or_path!r} offline (no "
        "config.json there or in the local Hugging Face cache, and no shipped copy in "
        f"sve/runs/architectures.py); set {key}.config={{model_type: ..., hidden_size: ..., ...}} or "
        f"{key}.name_or_path to a directory holding its config.json"
    )


def offline_backbone(node: DictConfig) -> dict:
    """The backbone config with random weights of the same architecture: nothing downloaded or read but a
    config.json; the offline character tokenizer (the plan's inputs have the configured lengths anyway)."""
    resolved = OmegaConf.to_container(node, resolve=True)
    if "pretrained" in resolved:
        resolved["pretrained"] = False
    if "checkpoint_path" in resolved:
        resolved["checkpoint_path"] = None
    if "tokenizer" in resolved:
        resolved["tokenizer"] = "char"
    if "name_or_path" in resolved:
        if not resolved.get("config"):
            resolved["config"] = architecture(resolved["name_or_path"])
        resolved["name_or_path"] = None
    return resolved


__all__ = ["ARCHITECTURES", "architecture", "offline_backbone"]
