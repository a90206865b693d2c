"""Typed settings, built once at the entry point and passed down.

Sources, strongest first: explicit arguments, ``CELLSIGHT_*`` environment variables,
the TOML file given with ``--config``. Every default is embedded: no server needed.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

_config_file: ContextVar[Path | None] = ContextVar("cellsight_config_file", default=None)


class ConfigError(Exception):
    """The configuration file or a setting is unusable; the message says which."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CELLSIGHT_", extra="forbid")

    data_dir: Path = Field(
        Path(".cellsight"), description="Holds the embedded databases, bus and index"
    )

    # Databases: the API database (cell and instance mappings). Cell URLs live in it.
    api_db_url: str | None = Field(None, description="Default: SQLite file in data_dir")
    db_connect_timeout: float = Field(5.0, gt=0, description="Seconds, per database connect")

    # Message bus.
    bus_url: str | None = Field(None, description="amqp://… in production; default: embedded Redis")
    exchange: str = "nova"
    publisher_id: str = "cellsight-ops"
    publish_timeout: float = Field(10.0, gt=0, description="Seconds to wait for a publish/confirm")

    # Indexer.
    indexer_queue: str = "cellsight.indexer"
    dead_letter_exchange: str = "cellsight.dlx"
    dead_letter_queue: str = "cellsight.dlq"
    batch_count: int = Field(1000, ge=1)
    batch_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    batch_age_ms: int = Field(200, ge=1)
    prefetch: int = Field(2000, ge=1)
    metrics_port: int | None = Field(None, ge=0, le=65535)
    verify_interval: float | None = Field(
        None, gt=0, description="Seconds between the indexer's anti-entropy repairs; default off"
    )

    # Search index.
    search_url: str | None = Field(
        None, description="http(s):// Elasticsearch/OpenSearch; default: embedded"
    )
    search_timeout: float = Field(5.0, gt=0)
    index_prefix: str = Field(
        "cellsight",
        pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="Prefix of index, alias and meta names",
    )

    # API.
    api_host: str = "127.0.0.1"
    api_port: int = Field(8774, ge=0, le=65535)
    auth_mode: Literal["dev", "token"] = "dev"
    token_file: Path | None = None
    max_limit: int = Field(1000, ge=1)
    safe_connect_cooldown: float = Field(
        30.0, ge=0, description="0 keeps the fallback until restart"
    )
    cell_timeout: float = Field(
        5.0, gt=0, description="Per-cell deadline on the fan-out path, seconds"
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("bus_url", "search_url", "api_db_url")
    @classmethod
    def _blank_is_default(cls, value: str | None) -> str | None:
        return value or None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file.get()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)

    @property
    def resolved_api_db_url(self) -> str:
        return self.api_db_url or f"sqlite:///{self.data_dir.resolve() / 'api.db'}"

    @property
    def cells_dir(self) -> Path:
        return self.data_dir / "cells"

    @property
    def bus_dir(self) -> Path:
        return self.data_dir / "bus"

    @property
    def index_path(self) -> Path:
        return self.data_dir / "index.db"


def load_settings(config: Path | None = None, **overrides: object) -> Settings:
    """Build the settings once; ``config`` is a TOML file of the same keys."""
    if config is not None and not config.is_file():
        raise ConfigError(f"--config {config}: no such file")
    token = _config_file.set(config)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"invalid settings: {exc}") from None
    finally:
        _config_file.reset(token)
