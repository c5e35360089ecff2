"""Runs: one run end to end (``run``), its config checks and probe (``validate``), run directories, locks and
remembered configs (``rundir``), scoring and re-evaluation (``evaluation``, ``evaluate``), result files
(``results``), multirun records (``multirun``), atomic writes (``writable``) and config resolvers
(``resolvers``)."""
