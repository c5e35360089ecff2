"""The paper's tables and figures: sweeps over a table's runs (``sweep``) with tuning on grids grown to an
interior optimum (``tuning``), the result store and table builder (``report``), rendering (``render``),
figures (``figures``), claims with intervals over the test set and the seeds (``claims``, ``bootstrap``, their
coverage measured in ``coverage``), the members' movement (``movement``) and the budget measurement
(``budget``)."""
