"""The budget curve of scripts/mini_budget.py read from a Lightning CSV log."""

import sys

from sve.report import REPO

sys.path.insert(0, str(REPO / "scripts"))
import mini_budget  # noqa: E402


def test_curve_reads_one_point_per_epoch_and_skips_the_final_evaluation(tmp_path):
    log = tmp_path / "csv" / "version_0"
    log.mkdir(parents=True)
    (log / "metrics.csv").write_text(
        "epoch,step,train/loss,val/acc,val/nll\n"
        "0,10,0.6,,\n"
        "0,31,,0.70,0.55\n"
        "1,63,,0.80,0.45\n"
        "2,63,,0.80,0.45\n"  # the evaluation after training, logged as one epoch more
        ",63,,0.80,0.45\n"  # ... or without an epoch
    )
    assert mini_budget.curve(tmp_path, epochs=2) == [
        {"epoch": 1, "val_acc": 0.70, "val_nll": 0.55}, {"epoch": 2, "val_acc": 0.80, "val_nll": 0.45}]
