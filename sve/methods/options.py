"""The option values of the method classes that need no torch to check: read by the config check before a run
imports anything heavy (``sve.runs.validate``) and by the classes when they are built (``sve.wrap`` builds them
without a config). Each check raises an ``InputError`` naming the key, the value and what is valid."""

from __future__ import annotations

import math

from sve.errors import InputError

# SVE's init multiplies each singular value by (1 + eps), eps ~ N(0, sigma_init^2); values pushed below zero
# are clamped to zero, a fraction Phi(-1 / sigma_init) of them. Above this sigma_init it exceeds 1%.
MAX_SIGMA_INIT = 0.43
FACTOR_DTYPES = ("float32", "bfloat16", "float16", "float64")


def check_sigma_init(value, key: str = "sigma_init") -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (number and 0 <= value < MAX_SIGMA_INIT):
        raise InputError(
            f"{key}={value!r} is not valid; expected a number in [0, {MAX_SIGMA_INIT}) (Table 7 uses 0.005 or 0.01; "
            "larger values clamp more than 1% of the singular values to zero at init)"
        )


def check_factor_dtype(value, key: str = "method.factor_dtype") -> None:
    if value is not None and value not in FACTOR_DTYPES:
        raise InputError(
            f"{key}={value!r} is not valid; expected null (the layer's dtype) or one of {list(FACTOR_DTYPES)}"
        )


def check_method_options(node, prefix: str = "method") -> None:
    """The options of a method config node that these checks cover (the others are the classes' own)."""
    if node is None:
        return
    if node.get("sigma_init") is not None:
        check_sigma_init(node.get("sigma_init"), f"{prefix}.sigma_init")
    if node.get("factor_dtype") is not None:
        check_factor_dtype(node.get("factor_dtype"), f"{prefix}.factor_dtype")
