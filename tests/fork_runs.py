"""Runs a list of training runs, each in a process forked from this one: ``python -m tests.fork_runs PLAN``.

PLAN is a JSON file: a list of ``{"dir": run dir, "overrides": [...]}``; each run's exit status (as ``train.py``
would end: 0, 2 for a user error, 143 for SIGTERM, or minus the signal that killed it) is written back into
the plan as ``"status"``. The interpreter and its imports (about 15 s on 2 cores) are paid once, not per run,
yet every run is a process of its own that a test can kill with SIGKILL. The parent does no torch work before
forking, so no thread pool is copied into the children.
"""

import json
import os
import sys

from sve.errors import one_line_errors
from sve.runs.run import run
from tests.conftest import compose_cfg


def child(spec: dict) -> None:
    code = 0
    try:
        with one_line_errors():  # as train.py: a user error is exit 2, SIGTERM 143
            run(compose_cfg(spec["overrides"], spec["dir"]))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - a bug: its traceback, then a failing status
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(plan_path: str) -> None:
    plan = json.loads(open(plan_path).read())
    for spec in plan:
        pid = os.fork()
        if pid == 0:
            child(spec)
        _, status = os.waitpid(pid, 0)
        spec["status"] = os.waitstatus_to_exitcode(status)
    with open(plan_path, "w") as f:
        json.dump(plan, f)


if __name__ == "__main__":
    main(sys.argv[1])
