"""``sve-bench [--parts vit_s bert_base table5 rule weights] [--tiny] [--out DIR]`` (``make bench``): the cost
benchmark (``sve.bench.benchmark``), written to ``./results/bench`` unless ``--out`` names another folder.
``sve-bench --gpu-check`` (``make gpu-check``): every GPU path checked on this machine (``sve.bench.gpu_check``)."""

import sys

from sve.errors import one_line_errors


def main() -> None:
    with one_line_errors():
        if "--gpu-check" in sys.argv[1:]:
            from sve.bench.gpu_check import main as gpu_check

            sys.exit(gpu_check([a for a in sys.argv[1:] if a != "--gpu-check"]))
        from sve.bench.benchmark import main as bench

        bench()


if __name__ == "__main__":
    main()
