"""``python -m sve.cli.gpu_plan plan|measure '<JSON list of overrides>' LAYERS CAPACITY``: one plan or one
measurement of ``sve-bench --gpu-check``'s plan part in a process of its own (``sve.bench.gpu_plan.child``
starts it), printed as one JSON line."""

import json
import sys


def main(argv: list[str]) -> None:
    from sve.bench.gpu_plan import measured_peaks, planned_peaks

    what, overrides, layers, capacity = argv[0], json.loads(argv[1]), int(argv[2]), int(argv[3])
    result = planned_peaks(overrides, layers, capacity) if what == "plan" else measured_peaks(overrides, layers)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
