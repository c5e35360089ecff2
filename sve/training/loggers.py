"""Lightning's CSV logger, continued by a resumed run: it appends to the run's metrics.csv, where Lightning's
own deletes the file of the earlier attempt when it starts."""

from __future__ import annotations

import csv
import io
import os
import warnings

from pytorch_lightning import loggers


class CSVLogger(loggers.CSVLogger):
    @property
    def experiment(self):
        if self._experiment is not None:
            return super().experiment
        path = os.path.join(self.log_dir, "metrics.csv")
        earlier = open(path, newline="").read() if os.path.isfile(path) else None
        with warnings.catch_warnings():  # "previous log files will be deleted": they are put back below
            warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
            writer = super().experiment
        if earlier is not None and hasattr(writer, "metrics_keys"):  # rank 0 (others get a dummy)
            with open(path, "w", newline="") as f:
                f.write(earlier)
            writer.metrics_keys = sorted(next(csv.reader(io.StringIO(earlier)), []))
        return writer
