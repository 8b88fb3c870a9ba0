from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FIXTURE = SHARED / "fixtures" / "visgym_maze2d_public.json"
PNG_DIR = SHARED / "fixtures" / "visgym_png"


@pytest.fixture(scope="session")
def visgym_fixture() -> Path:
    if not FIXTURE.exists():
        pytest.skip(f"VisGym fixture not found at {FIXTURE} (a user's clone has no ../shared)")
    return FIXTURE


@pytest.fixture(scope="session")
def visgym_png_dir() -> Path:
    if not PNG_DIR.exists():
        pytest.skip(f"VisGym frames not found at {PNG_DIR}")
    return PNG_DIR
