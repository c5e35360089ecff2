"""The architectures of the paper's Hugging Face backbones, so that a memory plan (``sve.runs.plan``) can build
them without a download when their config.json is not in the local cache.

Each entry is the ``config.json`` of the checkpoint a backbone config names (``backbone.name_or_path``),
reduced to the keys that decide the parameter shapes and the computation; the weights are never needed for
a plan. The timm backbones (DINO, DINOv2, the random ViT, EfficientNet) build from timm's code and need
no entry here.
"""

from __future__ import annotations

ARCHITECTURES: dict[str, dict] = {
    # LLaMA-2-7B (Touvron et al., 2023): 6,738,415,616 parameters with lm_head.
    "meta-llama/Llama-2-7b-hf": {
        "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "mlp_bias": False,
    },
    # BERT-base-uncased (Devlin et al., 2019): 109,482,240 parameters with the pooler.
    "bert-base-uncased": {
        "model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "intermediate_size": 3072,
        "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_act": "gelu", "max_position_embeddings": 512,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "pad_token_id": 0,
    },
}


__all__ = ["ARCHITECTURES"]
