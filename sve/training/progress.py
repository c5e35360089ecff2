"""The training progress bar: Lightning's Rich bar, counting epochs as a reader does (1 to max_epochs)."""

from __future__ import annotations

from pytorch_lightning.callbacks import RichProgressBar


class EpochProgressBar(RichProgressBar):
    """Lightning's bar says "Epoch 1/1" in the second epoch of two: the current epoch counted from 0 over the
    last epoch's index. This one says "Epoch 2/2": the epoch running, counted from 1, of the epochs that will
    run. (``_get_train_description`` is the bar's own hook for that text; Lightning has no public one.)"""

    def _get_train_description(self, current_epoch: int) -> str:
        text = f"Epoch {current_epoch + 1}"
        if self.trainer.max_epochs is not None and self.trainer.max_epochs >= 0:
            text += f"/{self.trainer.max_epochs}"
        if len(self.validation_description) > len(text):  # as Lightning pads it: no flicker beside "Validation"
            text = f"{text:{len(self.validation_description)}}"
        return text
