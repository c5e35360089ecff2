"""The README's Python example runs as it stands, and does what its comments say."""

import re

import torch

from tests.conftest import ROOT


def readme_block(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    part = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", part, flags=re.S)
    return block


def test_the_own_model_example_runs_verbatim_and_its_adapter_reloads_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example writes ./mobilenet-sve
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(readme_block("SVE on your own model"), "README.md", "exec"), scope)
    ensemble, again, images = scope["ensemble"], scope["again"], scope["images"]
    assert ensemble(images).shape == (4, 8, 10)
    ensemble.eval(), again.eval()
    with torch.no_grad():
        assert torch.equal(ensemble(images), again(images))
    torch.testing.assert_close(scope["prediction"].probs.sum(-1), torch.ones(8, dtype=torch.float64))
    counts = ensemble.parameter_counts()
    assert counts["trainable"] < 0.05 * counts["base"] < counts["stored"]
    assert (tmp_path / "mobilenet-sve" / "adapter_model.safetensors").is_file()
