"""Hostile values through the real CLI entry point never produce a traceback: each is
accepted or refused with one ``error:`` line and the documented exit code."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cellsight.cli import app

runner = CliRunner()
text = st.one_of(
    st.text(max_size=300),
    st.sampled_from(
        [
            "",
            "sqlite://",
            "sqlite:///:memory:",
            "sqlite:////nonexistent/" + "d/" * 200 + "x.db",
            "mysql://u:p@[::1",
            "postgresql://u:p@host:99999999999999999999/db",
            "oracle://scott:tiger@db/orcl",
            "\x00",
            "sqlite:///" + "x" * 5000,
            "💥://💥",
        ]
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=text, db_url=text)
def test_cells_add_never_tracebacks(name: str, db_url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--data-dir", str(Path(tmp) / "d"), "cells", "add", "--name", name]
        result = runner.invoke(app, [*args, "--db-url", db_url])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code:
        assert "error: " in result.output or "Usage:" in result.output


@settings(max_examples=40, deadline=None)
@given(
    value=st.one_of(
        # What an environment variable can hold: no NUL, and no lone surrogate (os.environ
        # encodes values as UTF-8, so the CLI can never be given one).
        st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=50),
        st.integers().map(str),
        st.just("9" * 5000),
    )
)
def test_bad_setting_values_are_usage_errors(value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = runner.invoke(
            app,
            ["--data-dir", tmp, "index", "purge", "--older-than", "1d"],
            env={"CELLSIGHT_BATCH_COUNT": value, "CELLSIGHT_SEARCH_URL": ""},
        )
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert "CELLSIGHT_BATCH_COUNT" in result.output, result.output
    else:  # accepted; the empty data directory has no index to purge yet (runtime, 1)
        assert result.exit_code in (0, 1) and "CELLSIGHT_BATCH_COUNT" not in result.output
    if not re.search(r"[0-9]", value) or re.fullmatch(r"-[0-9]+|0+|[0-9]{4301,}", value):
        assert result.exit_code == 2, (value, result.output)
