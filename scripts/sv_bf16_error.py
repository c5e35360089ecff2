"""Measures what storing SVE's frozen U and V in bfloat16 costs (the llama2_7b setting).

For each weight matrix W: SVD once, cast U and V^T to bf16 (the singular values stay float32, as SVE trains
them), and report
- weight error  |U diag(s) V^T - W|_F / |W|_F (reconstruction in float64 from the bf16 factors);
- output error  |x (U diag(s) V^T)^T - x W^T| / |x W^T| on random inputs x;
- the same two numbers for simply storing W in bf16 (what the frozen bf16 backbone already pays).

Matrices: random Gaussian ones of LLaMA-2-7B's shapes (4096x4096 attention, 11008x4096 MLP; the SVD of the
large one takes minutes on a laptop CPU, so it is opt-in with --llama-mlp) and, when ``smollm2_135m`` in the
project's cache (``$XDG_CACHE_HOME/sve``) exists (``scripts/convert_smollm2.py``), real SmolLM2 weights.

Usage: python scripts/sv_bf16_error.py [--sizes 1024 4096] [--llama-mlp]
"""

from __future__ import annotations

import argparse

import torch

from sve.layers import SVLinear
from sve.paths import cache_root


def errors(W: torch.Tensor, n_inputs: int = 64) -> dict[str, float]:
    layer = torch.nn.Linear(W.shape[1], W.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(W)
    # float32 SVD is ample here: its own error (~1e-6) is far below bf16's (~1e-3 to 1e-2).
    sv = SVLinear.from_linear(layer, ensemble_size=1, svd_dtype=torch.float32, factor_dtype=torch.bfloat16)
    W64 = W.double()
    W_sv = (sv.U.double() * sv.singular_values[0].detach().double()) @ sv.Vh.double()
    W_bf16 = W.bfloat16().double()
    x = torch.randn(n_inputs, W.shape[1], dtype=torch.float64)
    ref = x @ W64.t()
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    return {
        "weight_sv_bf16": rel(W_sv, W64),
        "output_sv_bf16": rel(x @ W_sv.t(), ref),
        "weight_plain_bf16": rel(W_bf16, W64),
        "output_plain_bf16": rel(x @ W_bf16.t(), ref),
    }


def report(name: str, W: torch.Tensor) -> None:
    e = errors(W)
    print(
        f"{name:38s} {tuple(W.shape)!s:14s} SV bf16 factors: weight {e['weight_sv_bf16']:.2e}, output "
        f"{e['output_sv_bf16']:.2e} | plain bf16 W: weight {e['weight_plain_bf16']:.2e}, output "
        f"{e['output_plain_bf16']:.2e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 4096], help="square random matrices")
    parser.add_argument("--llama-mlp", action="store_true", help="also the 11008x4096 MLP shape (slow)")
    args = parser.parse_args()
    torch.manual_seed(0)
    for n in args.sizes:
        report(f"random Gaussian {n}x{n}", torch.randn(n, n) / n**0.5)
    if args.llama_mlp:
        report("random Gaussian (LLaMA-2-7B MLP)", torch.randn(11008, 4096) / 64)
    smol = cache_root("smollm2_135m", "model.safetensors")
    if smol.exists():
        from safetensors.torch import load_file

        weights = load_file(smol)
        for key in (
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.15.mlp.down_proj.weight",
            "model.layers.29.mlp.up_proj.weight",
        ):
            report(f"SmolLM2 {key.removeprefix('model.').removesuffix('.weight')}", weights[key].float())


if __name__ == "__main__":
    main()
