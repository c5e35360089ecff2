"""``sve-bench [--parts vit_s bert_base table5 rule weights] [--tiny] [--out DIR]`` (``make bench``): the cost
benchmark (``sve.bench.benchmark``), written to ``./results/bench`` unless ``--out`` names another folder."""

from sve.errors import one_line_errors


def main() -> None:
    with one_line_errors():
        from sve.bench.benchmark import main as bench

        bench()


if __name__ == "__main__":
    main()
