"""``sve-bench [--parts vit_s bert_base table5 rule weights] [--tiny] [--out DIR]`` (``make bench``): the cost
benchmark (``sve.bench.benchmark``), written to ``./results/bench`` unless ``--out`` names another folder.
``sve-bench --gpu-check`` (``make gpu-check``): every GPU path checked on this machine (``sve.bench.gpu_check``)."""

import argparse
import sys
from pathlib import Path

from sve.errors import one_line_errors

PARTS = ("vit_s", "bert_base", "table5", "front", "rule", "weights")  # each writes <out>/<part>.json


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options; defined here, without torch, so that ``--help`` answers at once."""
    from sve.cli.configs import module_doc
    from sve.training.allocator import POLICIES

    parser = argparse.ArgumentParser(prog="sve-bench", description=module_doc("sve.bench.benchmark").split("\n\n")[0])
    parser.add_argument(
        "--parts",
        nargs="+",
        default=list(PARTS),
        choices=PARTS,
        help="what to measure, each written to <out>/<part>.json (default: all)",
    )
    parser.add_argument("--layers", type=int, default=1, help="transformer blocks in the vit_s/bert_base parts")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (after warm-up)")
    parser.add_argument(
        "--full-depth-eval",
        nargs="*",
        default=["vit_s"],
        choices=["vit_s", "bert_base"],
        help="settings whose evaluation at batch 16 is also timed at the full depth (SVE, M dense)",
    )
    parser.add_argument("--train-batch", type=int, default=4, help="training batch per member")
    parser.add_argument(
        "--table5-methods",
        nargs="+",
        default=None,
        help="the methods of the table5 part (default: every row of Table 5)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads; default 1 on the CPU (a shared machine stalls multi-threaded small "
        "operators at thread barriers, so times would measure the other processes)",
    )
    parser.add_argument(
        "--cpu-allocator",
        default="tuned",
        choices=POLICIES,
        help="the C allocator's policy for this process (sve/training/allocator.py): tuned keeps freed "
        "memory for reuse, system leaves glibc's defaults (which fault pages in every step)",
    )
    parser.add_argument(
        "--svd-cache",
        default=None,
        help="SVD cache directory ('' for none; default: the cache of sve.layers.svd_cache)",
    )
    parser.add_argument("--out", type=Path, default=Path("results") / "bench", help="default: results/bench")
    parser.add_argument("--tiny", action="store_true", help="tiny backbones and 1 repeat (tests)")
    return parser


def bench(argv: list[str] | None = None) -> None:
    """The benchmark's command line: the options checked, then ``sve.bench.benchmark.run_parts``."""
    import torch

    from sve.bench.benchmark import run_parts
    from sve.bench.table5 import TABLE5_DEFAULT
    from sve.layers.svd_cache import default_dir

    parser = arguments()
    args = parser.parse_args(argv)
    args.table5_methods = args.table5_methods or TABLE5_DEFAULT
    args.svd_cache = str(default_dir()) if args.svd_cache is None else args.svd_cache
    if args.tiny:
        args.repeats, args.layers, args.train_batch = 1, 1, 2
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a device torch knows; e.g. cpu, cuda, cuda:1")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"--device {args.device}: torch finds no CUDA GPU here (torch {torch.__version__}); use --device cpu"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        parser.error(f"--device {args.device}: only {torch.cuda.device_count()} GPU(s) are visible")
    run_parts(args, device, PARTS)


def gpu_check(argv: list[str] | None = None) -> int:
    """``sve-bench --gpu-check``'s command line (its arguments without ``--gpu-check``): ``sve.bench.gpu_check``."""
    from sve.bench.gpu_check import PARTS as CHECKS
    from sve.bench.gpu_check import check
    from sve.cli.configs import module_doc

    parser = argparse.ArgumentParser(
        prog="sve-bench --gpu-check", description=module_doc("sve.bench.gpu_check").split("\n\n")[0]
    )
    parser.add_argument("--parts", nargs="+", default=list(CHECKS), choices=CHECKS)
    parser.add_argument("--out", type=Path, default=Path("results") / "bench")
    args = parser.parse_args(argv)
    return check(args.parts, args.out)


def main() -> None:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        arguments().parse_args(sys.argv[1:])  # prints the help and exits, without importing torch
    from sve.cli.quiet import hide_noise

    hide_noise()
    with one_line_errors():
        if "--gpu-check" in sys.argv[1:]:
            sys.exit(gpu_check([a for a in sys.argv[1:] if a != "--gpu-check"]))
        bench()


if __name__ == "__main__":
    main()
