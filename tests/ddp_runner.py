"""Runs several configs one after another in one process group: ``python -m tests.ddp_runner OUT_DIR
'overrides of run 1' 'overrides of run 2' ...`` writes OUT_DIR/<i>/results.json (or failed.json,
the one failure record of a run directory: ``sve.runs.multirun.record_failure``). A run given as
``'@NAME overrides'`` runs in OUT_DIR/NAME instead: two runs naming one directory are a run and its resume.

With ``trainer=ddp_sim`` Lightning starts the second rank by running this same command again, so both ranks
go through the same list in step; a run that fails (on every rank alike) is recorded and the next one starts.
"""

import shlex
import sys
from pathlib import Path

from sve.runs.multirun import record_failure
from sve.runs.run import run
from tests.conftest import compose_cfg


def main(out_dir: str, runs: list[str]) -> None:
    for i, overrides in enumerate(runs):
        name = str(i)
        if overrides.startswith("@"):
            name, _, overrides = overrides[1:].partition(" ")
        run_dir = Path(out_dir) / name
        try:
            run(compose_cfg(shlex.split(overrides), run_dir))
        except Exception as err:  # noqa: BLE001 - recorded for the test to read
            run_dir.mkdir(parents=True, exist_ok=True)
            record_failure(run_dir, err)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
