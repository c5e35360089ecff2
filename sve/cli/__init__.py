"""The console entry points (``pyproject.toml`` ``[project.scripts]``): ``sve-train``, ``sve-eval``,
``sve-sweep``, ``sve-tables``, ``sve-bench``. Each imports the heavy libraries (torch, Lightning) only once
it has work to do, so ``--help`` and a config error answer at once; ``python -m sve.cli.<name>`` runs the same
code with the interpreter it names (what a sweep uses for its runs)."""
