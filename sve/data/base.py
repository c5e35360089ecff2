"""Data modules. Each knows its splits; the backbone supplies the tokenizer or the image preprocessing.

``run`` builds the backbone first and calls ``datamodule.attach(backbone)``; every batch is a dict with
``labels`` plus ``pixel_values`` (images) or ``input_ids``/``attention_mask`` (text, padded per batch), and
``loss_scale`` (training) or ``valid`` and ``index`` (evaluation) from the samplers of ``sve.data.sampling``,
which also decide what each process sees under DDP.

A trained model is evaluated on named sets (``evaluation_sets``): ``val`` (temperature scaling is fitted on
it), ``test``, ``ood`` when an OOD data module is attached, and for image data with ``corruptions`` set, the
test split under each corruption and severity, ``shift/<corruption>/<severity>``, and ``shifted/<name>`` for
each data module given as ``shifted``: another set of the same task and format whose test split is a natural
distribution shift (ARC-Challenge beside ARC-Easy), scored beside the test set with the run's own temperature.

Checking the data (``check_data``): before the backbone exists, every data file the run will use is read,
parsed and checked (each split, the OOD module's test split, the subset sizes, and for image files every image
the chosen subsets read), and what was parsed is kept, so ``setup`` after ``attach`` reads nothing again. Any
user error is one ``sve.errors.InputError`` naming the file and line or the config key, the value and what is
expected. Constructing a data module reads nothing.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from sve.data.checks import check_subset_size, subset_indices
from sve.data.corruptions import CORRUPTIONS, SEVERITIES, choose
from sve.data.options import check_data_options
from sve.data.sampling import EvalBatchSampler, Keyed, KeyedCollate, TrainBatchSampler
from sve.errors import InputError

log = logging.getLogger(__name__)
SHIFT = "shift"  # evaluation sets shift/<corruption>/<severity>
SHIFTED = "shifted"  # evaluation sets shifted/<name>: another data module's test split (``shifted``)
SPLITS = ("train", "val", "test")


def take_subset(dataset: Dataset, size: int | None, seed: int, name: str, key: str = "dataset") -> Dataset:
    """A seeded random subset of ``size`` examples; the dataset itself when size is None or its length. A
    size above its length is an error (``check_data`` finds it before any work)."""
    what = "each corrupted test set" if name == "shift" else f"the {name} split"
    check_subset_size(f"{key}.{name}_size", size, len(dataset), what)
    indices = subset_indices(len(dataset), size, seed)
    return dataset if indices is None else Subset(dataset, indices)


class ClassificationData(pl.LightningDataModule):
    """Common split handling: seeded subsets for CPU-sized runs and the three loaders.

    Args:
        batch_size: the global batch size (Table 7), split across devices and accumulation steps.
        eval_batch_size: examples per validation and test batch on each process (default: ``batch_size``); the
            batches are the same on any number of processes (``sve.data.sampling``).
        train_size, val_size, test_size: optional subset sizes (seeded by ``subset_seed``), at most the
            split's size.
        num_workers: DataLoader workers.
        ood: another data module whose test split is the out-of-distribution set (e.g. CIFAR-10 for
            CIFAR-100, Table 4); the test loop then also reports OOD AUROC, AUPRC and FPR@95%TPR.
        shifted: {name: data module} whose test splits are shifted sets of the same task and classes (e.g.
            ARC-Challenge for an ARC-Easy run); each is evaluated as ``shifted/<name>``, and takes this module's
            ``model_keys`` values (what shapes the model: ARC's scoring, the lengths), whatever its own config says.
    """

    modality: str  # "image" or "text"; must match the backbone's
    num_classes: int
    # Arguments that change the model built on this data (what ``attach`` makes the backbone's features, so the
    # heads' shapes): ``sve-eval`` with another dataset option keeps the trained run's values of these.
    model_keys: tuple[str, ...] = ()

    def __init__(
        self,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        train_size: int | None = None,
        val_size: int | None = None,
        test_size: int | None = None,
        subset_seed: int = 0,
        num_workers: int = 0,
        ood: ClassificationData | None = None,
        shifted: dict[str, ClassificationData] | None = None,
    ):
        super().__init__()
        check_data_options(
            {
                "batch_size": batch_size,
                "eval_batch_size": eval_batch_size,
                "train_size": train_size,
                "val_size": val_size,
                "test_size": test_size,
                "num_workers": num_workers,
            }
        )
        self.ood = ood
        self.key = "dataset"  # the config key of this module, in error messages
        self.used_splits = SPLITS  # the splits a run reads (an OOD module: its test split only)
        if ood is not None:
            ood.key, ood.used_splits = "dataset.ood", ("test",)
        self.shifted = dict(shifted or {})
        for name, module in self.shifted.items():
            if not isinstance(module, ClassificationData):
                raise InputError(
                    f"dataset.shifted.{name}: expected a data module config with a _target_ (e.g. "
                    f"+shifted=arc_challenge), got {type(module).__name__}"
                )
            module.key, module.used_splits = f"dataset.shifted.{name}", ("test",)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.subset_seed = subset_seed
        self.num_workers = num_workers
        self.splits: dict[str, Dataset] = {}
        self.parsed: dict[str, Dataset] | None = None  # the full splits as read by check_data
        self.notes: dict[str, str] = {}  # where each split comes from, for error messages (read_splits)
        self._verified = False
        self.backbone = None
        # Set by ``run`` (``distribute``) and by the checkpoint callback on resume.
        self.world_size, self.rank, self.accumulate = 1, 0, 1
        self.order_seed = 0  # seeds the training order; one value per fit (a sequential ensemble's rounds)
        self.resume_position: tuple[int, int] | None = None  # (epoch, global batches done)
        self.train_sampler: TrainBatchSampler | None = None
        self.unsharded = False

    def attach(self, backbone) -> None:
        if backbone.modality != self.modality:
            raise InputError(
                f"dataset {type(self).__name__} is {self.modality} data but backbone "
                f"{type(backbone).__name__} takes {backbone.modality} inputs; pick a matching pair"
            )
        self.backbone = backbone
        for module in self.shifted.values():  # the values that shape the model are the trained run's
            for key in self.model_keys:
                setattr(module, key, getattr(self, key))
        for module in self.companions():
            module.attach(backbone)

    def companions(self) -> list[ClassificationData]:
        """The data modules evaluated beside this one, on their test split only: ``ood``, then each ``shifted``."""
        return ([self.ood] if self.ood is not None else []) + list(self.shifted.values())

    @property
    def what(self) -> str:
        """``dataset <name>`` (``dataset.ood <name>`` for an OOD module), as error messages name it."""
        return f"{self.key} {getattr(self, 'name', None) or type(self).__name__}"

    def read_splits(self) -> dict[str, Dataset]:  # pragma: no cover - abstract
        """The full ``train``, ``val`` and ``test`` datasets as read from the files, checked, without the
        backbone; any user error is an ``InputError``. May fill ``notes`` (split -> where it comes from)."""
        raise NotImplementedError

    def class_names(self) -> list | None:
        """Label i's name is ``class_names()[i]`` where the data names its classes (``image_folder``,
        ``text_table``); None elsewhere. results.json and the adapter record it."""
        return None

    def check_data(self) -> None:
        """Reads and checks every data file the run will use before the backbone exists (the splits, the OOD
        module's, the subset sizes, each chosen image decoded once); any user error, or failed download, is one
        ``InputError``. Idempotent: ``setup`` calls it and reuses ``parsed``. Cheap checks come first."""
        self._parse()
        self._verify()

    def _parse(self) -> None:
        if self.parsed is None:
            parsed = self.read_splits()
            for split in SPLITS:
                dataset = parsed[split]
                where = f"the {split} split of {self.what}" + (f" ({self.notes[split]})" if split in self.notes else "")
                if len(dataset) == 0:
                    raise InputError(f"{where} is empty")
                check_subset_size(f"{self.key}.{split}_size", self.sizes[split], len(dataset), where)
                check_labels(dataset, self.num_classes, f"{self.what} {split} split")
            self.check_parsed(parsed)
            self.parsed = parsed
        for module in self.companions():
            module._parse()

    def _verify(self) -> None:
        if not self._verified:
            self.verify_selected(
                {
                    s: (self.parsed[s], subset_indices(len(self.parsed[s]), self.sizes[s], self.subset_seed))
                    for s in self.used_splits
                }
            )
            self._verified = True
        for module in self.companions():
            module._verify()

    def check_parsed(self, parsed: dict[str, Dataset]) -> None:
        """Checks of the parsed splits beyond their sizes and labels (a subclass's hook)."""

    def verify_selected(self, selected: dict[str, tuple[Dataset, list[int] | None]]) -> None:
        """Checks the examples the run reads, ``{split: (full split, subset indices or None for all)}``,
        e.g. decodes their image files (a subclass's hook; the data in memory needs none)."""

    def load_splits(self) -> dict[str, Dataset]:
        """The full splits as the loaders read them (image data: with the backbone's transforms, after ``attach``)."""
        self.check_data()
        return dict(self.parsed)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.check_data()
        for split, dataset in self.load_splits().items():
            self.splits[split] = take_subset(dataset, self.sizes[split], self.subset_seed, split, self.key)
        log.info("%s: %s", type(self).__name__, {k: len(v) for k, v in self.splits.items()})

    def collate(self, examples: list) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def distribute(self, world_size: int, rank: int, accumulate: int = 1) -> None:
        """Which share of every batch this process takes (``run`` calls it once the trainer exists)."""
        self.world_size, self.rank, self.accumulate = world_size, rank, accumulate
        for module in self.companions():
            module.distribute(world_size, rank, accumulate)

    def per_device_batch_size(self) -> int:
        return -(-self.batch_size // (self.world_size * self.accumulate))

    def _loader(self, dataset: Dataset, sampler, persistent: bool = True) -> DataLoader:
        generator = torch.Generator().manual_seed(self.order_seed)  # worker seeds: not from the global RNG
        return DataLoader(
            Keyed(dataset, self.order_seed),
            batch_sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=KeyedCollate(self.collate),
            persistent_workers=persistent and self.num_workers > 0,
            generator=generator,
        )

    def eval_loader(self, dataset: Dataset, persistent: bool = True) -> DataLoader:
        """This process's share of ``dataset``, each example once over all processes (``valid`` marks the
        padding); ``persistent=False`` for a loader used once, so its workers end with it."""
        sampler = EvalBatchSampler(len(dataset), self.eval_batch_size, self.world_size, self.rank)
        return self._loader(dataset, sampler, persistent)

    @contextmanager
    def whole_training_split(self):
        """Within it, ``train_dataloader()`` gives the whole training split to every process, in a fixed order
        and the plain batch format: for work after training that all ranks must do alike (``after_fit``)."""
        self.unsharded = True
        try:
            yield self
        finally:
            self.unsharded = False

    def train_dataloader(self) -> DataLoader:
        if self.unsharded:
            self.setup()
            # Epoch 0's order on one device, augmentations seeded per example as in training.
            order = TrainBatchSampler(len(self.splits["train"]), self.batch_size, self.order_seed).order(0)
            return DataLoader(
                Keyed(self.splits["train"], self.order_seed),
                batch_size=self.batch_size,
                sampler=[(i, 0, 1.0) for i in order],
                num_workers=self.num_workers,
                collate_fn=KeyedCollate(self.collate, plain=True),
            )
        self.setup()
        sampler = TrainBatchSampler(
            len(self.splits["train"]), self.batch_size, self.order_seed, self.world_size, self.rank, self.accumulate
        )
        if self.resume_position is not None:
            sampler.resume_at(*self.resume_position)
            self.resume_position = None
        self.train_sampler = sampler
        return self._loader(self.splits["train"], sampler)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return self.eval_loader(self.splits["val"])

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """The test split, followed by the OOD set's test split when ``ood`` is given."""
        self.setup()
        if self.ood is None:
            return self.eval_loader(self.splits["test"])
        return [self.eval_loader(self.splits["test"]), self.ood.test_dataloader()]

    def evaluation_sets(self) -> list[str]:
        """The sets a trained model is evaluated on, in order (see the module docstring)."""
        return ["val", "test"] + (["ood"] if self.ood is not None else []) + [f"{SHIFTED}/{n}" for n in self.shifted]

    def evaluation_loader(self, name: str) -> DataLoader:
        """A one-use loader of the evaluation set ``name``."""
        self.setup()
        if name == "ood" and self.ood is not None:
            self.ood.setup()
            return self.ood.eval_loader(self.ood.splits["test"], persistent=False)
        if name.startswith(f"{SHIFTED}/") and name.split("/", 1)[1] in self.shifted:
            module = self.shifted[name.split("/", 1)[1]]
            module.setup()
            return module.eval_loader(module.splits["test"], persistent=False)
        if name not in ("val", "test"):
            raise ValueError(f"{type(self).__name__} has no evaluation set {name!r}; it has {self.evaluation_sets()}")
        return self.eval_loader(self.splits[name], persistent=False)


def check_labels(dataset: Dataset, num_classes: int, what: str) -> None:
    """Every label of an in-memory split (a list of examples whose second item is the label) is an integer in
    [0, num_classes); other datasets are checked by their readers."""
    if not isinstance(dataset, list):
        return
    for i, example in enumerate(dataset):
        label = example[1]
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < num_classes:
            raise InputError(
                f"{what}, example {i}: label {label!r} is not valid; expected an integer in 0..{num_classes - 1}"
            )


class TextClassificationData(ClassificationData):
    """Examples are ``(text, label)`` pairs; tokenised per batch with dynamic padding.

    Args:
        max_length: truncation length in tokens (Table 7: 128 for SST-2).
    """

    modality = "text"
    model_keys = ("max_length",)  # what the model reads of each text: a shifted set is read as the run read its own

    def __init__(self, max_length: int = 128, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def attach(self, backbone) -> None:
        super().attach(backbone)
        # A model with a learned position table (BERT, RoBERTa, GPT-2, OPT, ...) cannot read past its last row:
        # a longer max_length fails inside the model at the first long batch, with an error about tensor sizes.
        limit = getattr(backbone, "max_positions", None)
        if limit is None:
            return
        if self.max_length is None:  # "as long as the text": as long as the model can read
            self.max_length = limit
        elif self.max_length > limit:
            raise InputError(
                f"{self.key}.max_length={self.max_length} is more than the {limit} positions of the "
                f"backbone's learned position embeddings; set {self.key}.max_length to at most "
                f"{limit}"
            )

    def collate(self, examples: list[tuple[str, int]]) -> dict:
        texts, labels = zip(*examples)
        enc = self.backbone.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "labels": torch.tensor(labels, dtype=torch.long),
        }


class ImageClassificationData(ClassificationData):
    """Examples are ``(image tensor, label)``; the transform is built from the backbone in ``attach``.

    Shift (Fig. 3): with ``corruptions`` set, a trained model is also evaluated on the test split under each
    corruption and severity of ``sve.data.corruptions``, each a set of its own (``shift/<corruption>/<severity>``,
    the same examples as ``test``: the same ``test_size`` subset); a subclass says how to corrupt its images
    (``shifted_test``).

    Args:
        corruptions: a name, a list of names, ``all`` (the 19 of ``sve.data.corruptions.CORRUPTIONS``), or
            None for no shift evaluation.
        severities: an int, a list, or ``all`` (1 to 5).
        corruption_seed: seed of the corruption generator (the same seed gives the same images).
        shift_size: evaluate each corrupted set on this many of the test split's examples (a seeded subset of
            them, the same for every corruption and severity), or None for all of them. Each corruption and
            severity is a full pass over its set, so on a CPU the shift evaluation can cost more than the
            training (19 x 5 sets for ``all``).
    """

    modality = "image"

    def __init__(
        self,
        corruptions: str | list[str] | None = None,
        severities: int | list[int] | str = "all",
        corruption_seed: int = 0,
        shift_size: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.corruptions = [] if corruptions is None else choose(corruptions, CORRUPTIONS, "corruptions")
        self.severities = choose(severities, SEVERITIES, "severities")
        self.corruption_seed = corruption_seed
        if shift_size is not None and (
            isinstance(shift_size, bool) or not isinstance(shift_size, int) or shift_size < 1
        ):
            raise InputError(
                f"dataset.shift_size={shift_size!r} is not valid; give a positive integer or null (all test examples)"
            )
        self.shift_size = shift_size

    def shifted_length(self, parsed: dict[str, Dataset]) -> int:
        """The number of examples of each corrupted test set (before ``test_size``)."""
        return len(parsed["test"])

    def check_parsed(self, parsed: dict[str, Dataset]) -> None:
        """With ``corruptions``: ``test_size`` and ``shift_size`` fit the corrupted sets (``evaluation_loader``
        takes the ``test_size`` subset of each, then ``shift_size`` of those)."""
        super().check_parsed(parsed)
        if not self.corruptions:
            return
        n, test_size = self.shifted_length(parsed), self.sizes["test"]
        if n != len(parsed["test"]):
            check_subset_size(f"{self.key}.test_size", test_size, n, f"each corrupted test set of {self.what}")
        of = f"{self.key}.test_size={test_size}" if test_size is not None else "its whole test split"
        check_subset_size(
            f"{self.key}.shift_size",
            self.shift_size,
            n if test_size is None else test_size,
            f"the test subset each corrupted set of {self.what} is made from ({of})",
        )

    def shifted_test(self, corruption: str, severity: int) -> Dataset:
        """The whole test split (before ``test_size``) under one corruption at one severity."""
        raise InputError(f"dataset {type(self).__name__} cannot make corrupted test sets; set dataset.corruptions=null")

    def evaluation_sets(self) -> list[str]:
        shifted = [f"{SHIFT}/{c}/{s}" for c in self.corruptions for s in self.severities]
        return super().evaluation_sets() + shifted

    def evaluation_loader(self, name: str) -> DataLoader:
        if not name.startswith(f"{SHIFT}/"):
            return super().evaluation_loader(name)
        _, corruption, severity = name.split("/")
        self.setup()
        shifted = self.shifted_test(corruption, int(severity))
        dataset = take_subset(shifted, self.sizes["test"], self.subset_seed, "test", self.key)  # the test examples
        dataset = take_subset(dataset, self.shift_size, self.subset_seed, "shift", self.key)  # some of them
        return self.eval_loader(dataset, persistent=False)

    def collate(self, examples: list) -> dict:
        images, labels = zip(*examples)
        return {"pixel_values": torch.stack(images), "labels": torch.tensor(labels, dtype=torch.long)}
