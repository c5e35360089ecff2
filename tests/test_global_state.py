"""The package's global mechanisms (a patched function, context or module state, a process-wide hook, an import
finder) are each listed with their reason in docs/architecture.md#global-state and commented where they live."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What sets up state that reaches code without an argument.
MARKERS = ("F.dropout = ", "ContextVar(", "WeakSet(", "register_optimizer_step_post_hook(", "sys.meta_path.insert(")


def test_every_global_mechanism_is_listed_in_the_docs_and_says_why_where_it_lives():
    uses = {str(path.relative_to(ROOT)): path.read_text() for path in sorted((ROOT / "sve").rglob("*.py"))}
    uses = {name: text for name, text in uses.items() if any(marker in text for marker in MARKERS)}
    _, heading, rest = (ROOT / "docs/architecture.md").read_text().partition("\n## Global state\n")
    assert heading, "docs/architecture.md has no '## Global state' section"
    section = rest.split("\n## ", 1)[0]
    listed = set(re.findall(r"`(sve/[\w/]+\.py)`", section))
    assert set(uses) == listed, "list each global mechanism, with its reason, in docs/architecture.md#global-state"
    uncommented = [name for name, text in uses.items() if "docs/architecture.md#global-state" not in text]
    assert not uncommented, f"say at the mechanism why an argument cannot do its job: {uncommented}"
