"""Runs: one run end to end (``run``), its config checks and probe (``validate``), run directories, locks and
remembered configs (``rundir``), scoring a trained module (``evaluation``) and a finished run again
(``reevaluate``), result files (``results``), multirun records (``multirun``), atomic writes (``writable``) and
config resolvers (``resolvers``)."""
