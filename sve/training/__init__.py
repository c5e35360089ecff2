"""Training: the one LightningModule (``module``), its optimiser schedule (``optim``), exact checkpoints
(``checkpoint``), random draws independent of the device layout (``draws``), learning curves (``curves``),
the CPU allocator policy (``allocator``) and loggers (``loggers``)."""
