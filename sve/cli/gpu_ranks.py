"""``python -m sve.cli.gpu_ranks OUT_DIR 'overrides of run 1' ...``: the runs of ``sve-bench --gpu-check``'s
distributed part in one process group (``sve.bench.gpu_ranks``; Lightning starts the second rank by running
this command again)."""

import sys


def main(argv: list[str]) -> None:
    from sve.bench.gpu_ranks import run_all

    run_all(argv[0], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
