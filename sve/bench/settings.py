"""The benchmark's settings (ViT-S, BERT-base) and what every part measures with: methods on one backbone, steps."""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field

import torch
from hydra import compose, initialize_config_dir

from sve.bench.counters import count_flops, interleaved_times, minor_faults, peak_memory, resident_bytes
from sve.methods import registry
from sve.paths import CONFIGS
from sve.runs.run import instantiate


@dataclass
class Setting:
    name: str
    title: str
    ensemble_size: int
    overrides: list[str]  # Hydra overrides selecting the backbone and its data
    modality: str
    tokens: int  # image size for images, sequence length for text
    depth_key: str
    full_depth: int
    vocab: int = 0
    num_classes: int = 2
    notes: list[str] = field(default_factory=list)

    def backbone_overrides(self, layers: int | None) -> list[str]:
        return [*self.overrides, f"{self.depth_key}={layers or self.full_depth}"]

    def batch(self, B: int, seed: int = 0) -> dict:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, self.num_classes, (B,), generator=g)
        if self.modality == "image":
            return {"pixel_values": torch.randn(B, 3, self.tokens, self.tokens, generator=g), "labels": labels}
        ids = torch.randint(1, self.vocab, (B, self.tokens), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


BERT_BASE = [
    "backbone=tiny_bert",
    "backbone.name=bert_base_random",
    "backbone.config.hidden_size=768",
    "backbone.config.num_attention_heads=12",
    "backbone.config.intermediate_size=3072",
    "backbone.config.vocab_size=30522",
    "backbone.config.max_position_embeddings=512",
    "dataset=synthetic_text",
    "dataset.max_length=128",
]


def settings(tiny: bool) -> dict[str, Setting]:
    if tiny:
        return {
            "vit_s": Setting(
                "vit_s",
                "tiny ViT (test)",
                2,
                ["backbone=tiny_vit", "dataset=synthetic_image"],
                "image",
                32,
                "++backbone.model_kwargs.depth",
                2,
                num_classes=4,
            ),
            "bert_base": Setting(
                "bert_base",
                "tiny BERT (test)",
                2,
                ["backbone=tiny_bert", "dataset=synthetic_text"],
                "text",
                16,
                "backbone.config.num_hidden_layers",
                2,
                vocab=141,
            ),
        }
    return {
        "vit_s": Setting(
            "vit_s",
            "ViT-S/16 (384 wide, 6 heads, MLP 1536, 197 tokens), M = 4",
            4,
            ["backbone=vit_small_random", "dataset=synthetic_image"],
            "image",
            224,
            "++backbone.model_kwargs.depth",
            12,
            num_classes=10,
        ),
        "bert_base": Setting(
            "bert_base",
            "BERT-base (768 wide, 12 heads, MLP 3072, sequence 128), M = 8",
            8,
            BERT_BASE,
            "text",
            128,
            "backbone.config.num_hidden_layers",
            12,
            vocab=30522,
        ),
    }


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides)


class Builder:
    """Methods on copies of one random backbone (so every SVE variant decomposes the same weights, once)."""

    def __init__(self, setting: Setting, layers: int | None, svd_cache: str | None, device: torch.device):
        self.setting, self.layers, self.svd_cache, self.device = setting, layers, svd_cache, device
        torch.manual_seed(0)
        self.pristine = instantiate(compose_cfg(setting.backbone_overrides(layers)).backbone)

    def method(self, name: str, *overrides: str, ensemble_size: int | None = None):
        M = ensemble_size or self.setting.ensemble_size
        decomposes = "svd_cache" in registry.option_config(name)  # the methods whose SVD a cache keeps
        extra = [f"method.svd_cache={self.svd_cache}"] if decomposes and self.svd_cache else []
        cfg = compose_cfg([*self.setting.backbone_overrides(self.layers), f"method={name}", *extra, *overrides])
        torch.manual_seed(1)
        method = instantiate(
            cfg.method, backbone=copy.deepcopy(self.pristine), ensemble_size=M, num_classes=self.setting.num_classes
        )
        return method.to(self.device)

    def datamodule(self):
        """A few synthetic examples, for the methods that fit something after training (Laplace)."""
        cfg = compose_cfg(
            [*self.setting.backbone_overrides(self.layers), "dataset.num_train=4", "dataset.batch_size=2"]
        )
        dm = instantiate(cfg.dataset)
        dm.attach(self.pristine)
        dm.setup()
        return dm


class Candidate:
    """A method with its optimiser; ``train_step`` and ``eval_step`` are what gets measured."""

    def __init__(self, method, lr: float = 1e-4):
        self.method = method
        self.optimizer = torch.optim.AdamW(method.trainable_parameters(), lr=lr)

    def train_step(self, batch: dict) -> None:
        m = self.method
        m.train()
        m.loss(m(batch), batch["labels"]).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        m.constrain_()

    @torch.no_grad()
    def eval_step(self, batch: dict) -> None:
        self.method.eval()
        self.method(batch)

    def resident(self) -> int:
        return resident_bytes(self.method, self.optimizer.state)


def measure(candidates: dict[str, Candidate], kind: str, batch: dict, repeats: int, device) -> dict:
    """Warm-up, then one pass counting FLOPs and memory, then interleaved timing rounds; per candidate:
    ms (median), flops, peak bytes, the raw seconds (for paired ratios) and the minor page faults of one more
    call after the timed rounds (in the steady state)."""
    steps = {
        n: (lambda c=c: c.train_step(batch)) if kind == "train" else (lambda c=c: c.eval_step(batch))
        for n, c in candidates.items()
    }
    out = {}
    for name, step in steps.items():
        step()  # warm-up: caches, optimiser state, lazy inits
        c = candidates[name]  # evaluation needs no optimiser state
        resident = c.resident() if kind == "train" else resident_bytes(c.method)
        flops = count_flops(step)
        out[name] = {"flops": flops, "peak_bytes": resident + peak_memory(step, device)}
    times = interleaved_times(steps, repeats, device, warmup=0)
    for name in steps:
        out[name]["ms"] = 1e3 * statistics.median(times[name])
        out[name]["seconds"] = times[name]
        out[name]["minor_faults"] = minor_faults(steps[name])
    return out


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)
