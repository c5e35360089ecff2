"""Safe starts: the warning when every member of an ensemble would start from one newly initialised head.

Keeping the model's head (``num_classes=None``) copies it into every member. That is what a pretrained
classifier wants; a head that is new (random, untrained) gives the members one random start where fresh heads
would give each its own draw, a free source of diversity, and the members then differ only by the method's own
init noise (SVE's ``sigma_init`` of 0.01 on the singular values).

The common case is a Hugging Face classifier loaded from an encoder's checkpoint,
``AutoModelForSequenceClassification.from_pretrained(name, num_labels=2)``: its classifier is not in the
checkpoint and is initialised anew. transformers (5.x) marks every parameter it loaded with
``_is_hf_initialized`` and leaves the ones it initialises unmarked, so a model with marked parameters whose
head has unmarked ones was loaded with a new head. A model built otherwise (from a config, by timm, by hand, a
``copy.deepcopy``, which drops the marks) carries no marks, and nothing is detected: ``wrap(head_is_new=True)``
says so, ``head_is_new=False`` says the head was trained after loading.
"""

from __future__ import annotations

import warnings

from torch import nn

LOADED_MARK = "_is_hf_initialized"  # set by transformers' from_pretrained on each parameter it loaded


def newly_initialised(model: nn.Module) -> set[str] | None:
    """The names of the parameters transformers' ``from_pretrained`` initialised anew instead of loading them
    (module docstring); None for a model without its marks (not loaded by transformers 5). Read before
    ``wrap`` replaces the head."""
    named = list(model.named_parameters())
    if not any(getattr(p, LOADED_MARK, False) for _, p in named):
        return None
    return {name for name, p in named if not getattr(p, LOADED_MARK, False)}


def warn_if_one_new_head(ensemble, new_parameters: set[str] | None) -> None:
    """Warns when the members of ``ensemble`` (more than one, each with its own head) all start from the
    model's head and transformers initialised that head anew (``newly_initialised``)."""
    method, config = ensemble.method, ensemble.config
    head = config.get("head")
    if not config.get("keep_head") or not new_parameters or head is None:
        return
    if method.ensemble_size < 2 or method.shared_head:
        return
    if not any(name.startswith(f"{head}.") for name in new_parameters):
        return
    warnings.warn(
        f"the model's head {head!r} is newly initialised (transformers' from_pretrained did not find it in the "
        f"checkpoint), and num_classes=None starts all {method.ensemble_size} members from this one random head: "
        f"they differ only by {config['method']}'s own init noise. Pass num_classes={config['num_classes']} "
        "(or head_is_new=True) so each member draws its own head (an untrained head loses nothing), or raise "
        "the init noise (sigma_init for SVE) or the learning rate; head_is_new=False if the head was trained "
        "after loading",
        stacklevel=3,
    )


def new_head_classes(backbone) -> int:
    """The class count of the model's head, for ``wrap(head_is_new=True)``: fresh member heads of that many
    classes, as ``num_classes=`` would give."""
    weights = getattr(backbone, "head_weights", None)
    if weights is None:
        raise ValueError(
            f"head_is_new=True draws fresh heads with the classes of the model's head, but its head "
            f"({getattr(backbone, 'head_name', None)!r}) is not a linear layer whose classes can be read: give "
            "num_classes"
        )
    return int(weights[0].shape[0])
