"""``taskq ui serve``'s refusal to serve a non-loopback address unauthenticated, and what
counts as loopback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from taskq.cli import main
from taskq.cli.ui import is_loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::"])
def test_serve_refuses_a_public_address_without_authentication(host: str) -> None:
    result = CliRunner().invoke(main, ["ui", "serve", "--host", host, "--port", "1"])
    assert result.exit_code == 2
    assert "refusing to serve the admin UI" in result.output
    assert "--allow-unauthenticated" in result.output


def test_serve_rejects_a_malformed_hook() -> None:
    result = CliRunner().invoke(
        main, ["ui", "serve", "--host", "0.0.0.0", "--authorize", "no_colon_here"]
    )
    assert result.exit_code == 2
    assert "module:attribute" in result.output


def test_ui_group_is_registered() -> None:
    result = CliRunner().invoke(main, ["ui", "serve", "--help"])
    assert result.exit_code == 0
    assert "--allow-unauthenticated" in result.output
