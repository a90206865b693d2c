"""Shared fixtures: the real services (``tests.support.services``), the Nova samples and
embedded settings.

A missing service skips its tests on a developer machine and fails them when
``CELLSIGHT_REQUIRE_SERVICES=1`` (CI), so CI can never pass by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before anything imports them: the plugin's and helpers' asserts get pytest's messages.
pytest.register_assert_rewrite("tests.support")

from cellsight.settings import Settings, load_settings  # noqa: E402
from tests.support.services import (  # noqa: E402, F401  (names kept for older imports)
    DIALECTS,
    MARIADB_URL,
    POSTGRES_URL,
    RABBITMQ_URL,
    REQUIRE_SERVICES,
    DatabaseFactory,
    port_open,
    unavailable,
)

pytest_plugins = ["tests.support.services"]

ROOT = Path(__file__).resolve().parent.parent
# Nova's published notification samples, resolved to plain JSON (the project's shared
# folder beside the checkout); CELLSIGHT_NOVA_SAMPLES points elsewhere (or nowhere).
SAMPLES_DIR = Path(
    os.environ.get("CELLSIGHT_NOVA_SAMPLES", ROOT.parent / "shared" / "nova-notification-samples")
)


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    """Nova's own samples, for the conformance tests only. They are not part of this
    repository: absent (a fresh clone) those tests skip, and CI never reads them (every
    other test uses notifications the project generates, ``tests.support.novagen``)."""
    if os.environ.get("CI"):
        pytest.skip(
            "Nova conformance samples are not read in CI: run the conformance tests on a "
            "developer machine with ../shared/nova-notification-samples beside the checkout"
        )
    if not SAMPLES_DIR.is_dir():
        pytest.skip(
            f"Nova conformance samples not found at {SAMPLES_DIR}: they are Nova's "
            "doc/notification_samples resolved to plain JSON, kept in the shared folder "
            "beside the checkout (../shared/nova-notification-samples) or wherever "
            "CELLSIGHT_NOVA_SAMPLES points"
        )
    return SAMPLES_DIR


@pytest.fixture(scope="session")
def nova_like_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Realistic notifications the project generates itself, one file per event kind of
    Nova's samples (same names), for every test that is not about Nova conformance."""
    from tests.support.novagen import write_sample_set

    return write_sample_set(tmp_path_factory.mktemp("nova-like"))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Embedded defaults in a fresh data directory."""
    return load_settings(data_dir=tmp_path / "data")
