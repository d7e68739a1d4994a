"""The `paper` presets that run in about two minutes or less on the 2-core CPU, run to the end and checked: every
claim must pass, so a paper preset cannot silently rot (issue 20). `make verify-paper` runs them; the list and its
times are in docs/performance.md ("Paper presets verified"). Slow: excluded from `make test`."""

from __future__ import annotations

import pytest

from iclab.experiments import run_experiment

#: experiment -> wall seconds of its paper preset on the quiet 2-core CPU (docs/performance.md)
VERIFIED = {
    "ahn2023.theorem2": 46,
    "ahn2023.theorem5": 32,
    "sun2025.constructions": 13,
    "sun2025.fig3": 64,
    "zhang2025.fig1": 10,
    "zhang2025.fig3": 24,
    "zhang2025.fig6": 20,
    "zhang2025.fig7": 60,
    "zhang2025.fig8": 60,
    "zhang2025.fig9": 10,
    "zhang2025.fig11": 30,
    "zhang2025.fig13": 30,
    "zhang2025.fig14": 87,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VERIFIED))
def test_paper_preset_passes_every_claim(name: str, tmp_path) -> None:
    res = run_experiment(name, "paper", out=tmp_path)
    failed = [(c.name, c.measured, c.expected) for c in res.claims if not c.passed]
    assert not failed, f"{name} at paper: {failed}"
