"""What the ``warehouse`` commands share: the repository root, their progress lines and the settings."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from resources.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the repository: warehouse_assets/cli/common.py


def say(message: str) -> None:
    print(message, flush=True)


def load_settings(env: Mapping[str, str]) -> Settings:
    """The settings ``env`` gives; a bad value is a clear error naming its variable."""
    from resources.settings import Settings

    try:
        return Settings.from_env(env)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
