"""Metrics: accuracy, ECE, NLL, Brier and OOD scores as torchmetrics (``scores``), temperature scaling
(``calibration``), collapsed members (``collapse``). The names of the first two are importable from here
(``from sve.metrics import classification_metrics``)."""

from sve.metrics.calibration import (  # noqa: F401 - the package's names
    LOG_T_BOUNDS,
    fit_temperature,
    nll,
    scaled_log_probs,
    temperature_scaled,
)
from sve.metrics.scores import (  # noqa: F401 - the package's names
    NLL_EPS,
    UNITS,
    Accuracy,
    BrierScore,
    ExpectedCalibrationError,
    NegativeLogLikelihood,
    OODDetection,
    Prediction,
    classification_metrics,
    disagreement,
    entropy,
    mutual_information,
    predictive_metrics,
    score,
    uncertainty,
)
