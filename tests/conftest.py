from __future__ import annotations

from pathlib import Path

import pytest

from mazerl.mazes.visgym import reference_file

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
# VisGym's own recording (easy + hard, seeds 0-63) ships with the package; its first frames are test data.
FIXTURE = reference_file()
PNG_DIR = DATA / "visgym_png"


@pytest.fixture(scope="session")
def visgym_fixture() -> Path:
    assert FIXTURE.is_file(), f"the shipped VisGym reference file is missing: {FIXTURE}"
    return FIXTURE


@pytest.fixture(scope="session")
def visgym_png_dir() -> Path:
    assert PNG_DIR.is_dir(), f"VisGym frames missing: {PNG_DIR}"
    return PNG_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A freshly built tiny Qwen3-VL model directory (random weights)."""
    from mazerl.policy.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT

    policy = load_policy(tiny_model_dir)
    return policy, ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)


@pytest.fixture(scope="session")
def small_mazes(tmp_path_factory) -> Path:
    """A small dataset (no reference splits) with 3x3- and 4x4-cell mazes."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    cfg = DatasetConfig.model_validate(
        {
            "reference_splits": {},
            "splits": {
                "heldout": {"count": 16, "max_turns": 18},
                "tiny": {"count": 16, "sizes": ["3x3"], "max_turns": 20},
                "train": {"count": 64},
            },
        }
    )
    out = tmp_path_factory.mktemp("data") / "mazes"
    generate_dataset(cfg, out)
    return out
