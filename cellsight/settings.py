"""Typed settings, built once at the entry point and passed down.

Sources, strongest first: explicit arguments, ``CELLSIGHT_*`` environment variables,
the TOML file given with ``--config``. Every default is embedded: no server needed.
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from cellsight.setting_types import MAX_PREFETCH, MAX_SECONDS, AmqpName, Seconds
from cellsight.settings_env import ENV_PREFIX, service_link_hint, service_link_value

__all__ = ["MAX_PREFETCH", "MAX_SECONDS", "ConfigError", "Settings", "load_settings"]

_config_file: ContextVar[Path | None] = ContextVar("cellsight_config_file", default=None)
log = logging.getLogger(__name__)


class ConfigError(Exception):
    """The configuration file or a setting is unusable; the message says which."""


def file_in_the_way(path: Path) -> Path | None:
    """The first part of ``path`` that exists, if it is no directory: a directory made
    there would fail later as the OS's "File exists" or "Not a directory"."""
    for part in (path, *path.parents):
        if part.exists():
            return None if part.is_dir() else part
    return None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    data_dir: Path = Field(
        Path(".cellsight"),
        description="Holds the embedded databases, bus and index (not empty: that would be "
        "the working directory)",
    )

    # Databases: the API database (cell and instance mappings). Cell URLs live in it.
    api_db_url: str | None = Field(None, description="Default: SQLite file in data_dir")
    db_connect_timeout: Seconds = Field(5.0, gt=0, description="Seconds, per database connect")
    db_lock_timeout: Seconds = Field(
        30.0,
        gt=0,
        description="Seconds a command's statement waits for a lock another session holds "
        "on a database's tables (a migration's ALTER TABLE) before it fails, naming the "
        "database as busy",
    )
    db_statement_timeout: Seconds = Field(
        300.0,
        gt=0,
        description="Seconds one statement of a command (and of the indexer's outbox relay) "
        "may take on a database before it fails, naming the database; a server that does "
        "not answer at all is left a second later (the API's reads have cell_timeout)",
    )

    # Message bus.
    bus_url: str | None = Field(
        None,
        description="amqp://… in production (`?heartbeat=N`: AMQP heartbeats, which the"
        " indexer and the API's node listener send); default: embedded Redis",
    )
    exchange: AmqpName = Field(
        "nova",
        description="Topic exchange Nova publishes notifications to (1 to 255 bytes of UTF-8)",
    )
    publisher_id: str = Field(
        "cellsight-ops",
        min_length=1,
        max_length=255,
        description="publisher_id of the notifications Cellsight emits",
    )
    publish_timeout: Seconds = Field(
        10.0, gt=0, description="Seconds to wait for a publish/confirm"
    )
    bus_visibility_timeout: Seconds = Field(
        120.0,
        gt=0,
        description="Embedded (Redis) bus: seconds before a fetched, unacked message is "
        "redelivered (after a consumer crash)",
    )
    outbox_relay_interval: Seconds | None = Field(
        10.0,
        gt=0,
        description="Seconds between the indexer's outbox relay passes over every cell; "
        "empty: off (then run `cellsight outbox relay` yourself)",
    )
    outbox_lease: Seconds = Field(
        30.0, gt=0, description="Seconds a relay holds a cell's outbox before another may"
    )

    # Indexer.
    indexer_queue: AmqpName = Field(
        "cellsight.indexer",
        description="The indexer's queue; one per indexer deployment (1 to 255 bytes of UTF-8)",
    )
    dead_letter_exchange: AmqpName = Field(
        "cellsight.dlx",
        description="Where undecodable or rejected messages go (1 to 255 bytes of UTF-8)",
    )
    dead_letter_queue: AmqpName = Field(
        "cellsight.dlq",
        description="Queue of dead letters (`cellsight dlq list|replay`) (1 to 255 bytes of UTF-8)",
    )
    batch_count: int = Field(
        1000, ge=1, le=1_000_000, description="Indexer: flush a batch at this many messages"
    )
    batch_bytes: int = Field(
        10 * 1024 * 1024, ge=1024, le=2**30, description="Indexer: flush a batch at this many bytes"
    )
    batch_age_ms: int = Field(
        200,
        ge=1,
        le=MAX_SECONDS * 1000,
        description="Indexer: flush a batch this old (milliseconds)",
    )
    prefetch: int = Field(
        2000, ge=1, le=MAX_PREFETCH, description="Messages the broker sends ahead of acks"
    )
    held_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024 * 1024,
        le=2**40,
        description="Indexer: bytes of message bodies a worker holds unacked; at this many "
        "it stops consuming (messages already sent go back to the queue), again at half",
    )
    max_in_flight: int = Field(
        0, ge=0, le=64, description="Bulk writes in flight per indexer; 0: 1 embedded, 5 HTTP"
    )
    write_process: bool = Field(
        True,
        description="Indexer: the engine's reads and writes in a writer process beside "
        "the consumer (which receives, decodes and acks); false: writer threads",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Indexer's Prometheus /metrics port; default off"
    )
    verify_interval: Seconds | None = Field(
        None, gt=0, description="Seconds between the indexer's anti-entropy repairs; default off"
    )

    # Scheduler.
    default_availability_zone: str | None = Field(
        "nova",
        max_length=255,
        description="Availability zone of a compute node in none (Nova's "
        "`default_availability_zone`): what a `Selection`, an instance placed on the node "
        "(by the scheduler, a named host or a live migration) and a zone request read; "
        "empty: null",
    )

    # Search index.
    search_url: str | None = Field(
        None, description="http(s):// Elasticsearch/OpenSearch; default: embedded"
    )
    search_timeout: Seconds = Field(5.0, gt=0, description="Seconds per search engine request")
    index_prefix: str = Field(
        "cellsight",
        pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="Prefix of index, alias and meta names",
    )

    # API.
    api_host: str = Field("127.0.0.1", description="Address `cellsight api` binds")
    api_port: int = Field(8774, ge=0, le=65535, description="Port `cellsight api` binds")
    auth_mode: Literal["dev", "token"] = Field(
        "dev", description="dev: X-Auth-Token user:project; token: tokens from token_file"
    )
    token_file: Path | None = Field(None, description="JSON/TOML token map for auth_mode token")
    api_token: str | None = Field(
        None,
        description="X-Auth-Token `query --url` and `nodes refresh --url` send to a running "
        "API (`--token` wins); default: cli:admin, an administrator in auth_mode dev",
    )
    max_limit: int = Field(1000, ge=1, le=1_000_000, description="Largest page the API returns")
    safe_connect_cooldown: Seconds = Field(
        30.0, ge=0, description="0 keeps the fallback until restart"
    )
    index_probe_interval: Seconds = Field(
        5.0, gt=0, description="Seconds between background probes of the search index"
    )
    fanout_workers: int = Field(32, ge=1, le=1024, description="Cell queries run at once (fan-out)")
    instance_list_per_project_cells: bool = Field(
        False,
        description="A project's fan-out reads only the cells its instance mappings name "
        "(Nova's option of that name): fewer queries, but a row whose mapping is missing or "
        "names another cell is left out there while the index lists it",
    )
    fanout_admission_wait: Seconds = Field(
        2.0,
        ge=0,
        description="Seconds a fan-out, or an index search, waits for room before a 503",
    )
    index_searches: int = Field(
        16,
        ge=1,
        le=1024,
        description="Index searches run at once; more wait fanout_admission_wait, then 503",
    )
    cell_timeout: Seconds = Field(
        5.0, gt=0, description="Per-cell deadline on the fan-out path, seconds"
    )
    node_cache_ttl: Seconds = Field(600.0, ge=0, description="Node state cache entry TTL, s")
    node_cache_refresh: Seconds = Field(
        0.0, ge=0, description="The API refreshes the node cache this often, s (0: never)"
    )
    node_cache_listen: bool = Field(
        False, description="The API listens on the bus to drop changed node cache entries"
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level of the API server; the CLI uses -v unless this is set"
    )

    @field_validator(
        "outbox_relay_interval",
        "default_availability_zone",
        "metrics_port",
        "verify_interval",
        mode="before",
    )
    @classmethod
    def _blank_is_off(cls, value: Any) -> Any:
        # `CELLSIGHT_METRICS_PORT=` (a template's empty value) is the default: off.
        return None if value == "" else value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_not_blank(cls, value: Any) -> Any:
        # Path("") is ".": an empty CELLSIGHT_DATA_DIR (or data_dir = "") would put the
        # databases, bus and index in whatever directory the command runs from.
        if isinstance(value, str) and not value.strip():
            raise PydanticCustomError(
                "blank_path",
                "must not be empty (it would be the working directory; unset it for the "
                "default .cellsight)",
            )
        return value

    @field_validator("data_dir")
    @classmethod
    def _data_dir_a_directory(cls, value: Path) -> Path:
        if (file := file_in_the_way(value)) is not None:
            raise PydanticCustomError(
                "not_a_directory", "{part} is a file, not a directory", {"part": str(file)}
            )
        return value

    @field_validator("bus_url", "search_url", "api_db_url", "api_token")
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


def check_regular_file(path: Path, label: str) -> None:
    """``path`` is a file to read whole (the ``--config`` TOML, the API's token file).
    What is wrong, said as it is: "no such file" for /dev/null or a directory sent the
    operator looking for a file that is there. A device or a pipe is refused too: a
    reader would read /dev/zero for ever, or block on a FIFO nobody writes."""
    if path.is_file():
        return
    if path.is_dir():
        raise ConfigError(f"{label} {path}: is a directory, not a file")
    if path.exists():
        raise ConfigError(f"{label} {path}: not a regular file (a device, pipe or socket)")
    raise ConfigError(f"{label} {path}: no such file")


def _origin(name: str, config: Path | None, overrides: Mapping[str, object]) -> str:
    """Where a setting's value came from, as the operator gave it: its environment
    variable (which wins over the file), else the ``--config`` file."""
    variable = f"{ENV_PREFIX}{name.upper()}"
    if name in overrides or any(k.upper() == variable for k in os.environ):
        return variable
    # A process given its settings, not the file's path (an indexer worker), says the file.
    return f"--config {config}" if config is not None else "--config"


def setting_label(settings: Settings, name: str, config: Path | None = None) -> str:
    """``name (where its value came from)``: its environment variable, the ``--config``
    file, or ``default`` (an error that named the variable for a default value sent the
    operator looking for one that was never set)."""
    if name not in settings.model_fields_set:
        return f"{name} (default)"
    return f"{name} ({_origin(name, config, {})})"


def load_settings(config: Path | None = None, **overrides: object) -> Settings:
    """Build the settings once; ``config`` is a TOML file of the same keys. An unknown
    ``CELLSIGHT_*`` variable is a warning, not an error (where an unknown TOML key is
    one): the environment is shared with other programs, the TOML file is Cellsight's."""
    from cellsight.settings_env import unknown_variables

    for line in unknown_variables(os.environ, list(Settings.model_fields)):
        log.warning("%s", line)
    if config is not None:
        check_regular_file(config, "--config")
    token = _config_file.set(config)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"]) or "settings"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        why = first["msg"]
        if first["type"] == "extra_forbidden":  # only the file can hold a key that is none
            close = difflib.get_close_matches(name.lower(), list(Settings.model_fields), n=1)
            why = "not a setting" + (f" (did you mean {close[0]}?)" if close else "")
        origin = _origin(name, config, overrides)
        given = next((v for k, v in os.environ.items() if k.upper() == origin), None)
        if given is not None and service_link_value(given):
            why += service_link_hint(origin)
        raise ConfigError(f"invalid setting {name} ({origin}): {why}{more}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # Only the --config file is parsed as TOML or decoded from bytes here.
        raise ConfigError(f"--config {config}: invalid TOML: {exc}") from None
    except ValueError as exc:
        # tomllib's own refusals that are no TOMLDecodeError (an integer of more than
        # 4,300 digits): the file is what the operator needs to look at.
        where = f"--config {config}: " if config is not None else ""
        raise ConfigError(f"{where}invalid settings: {exc}") from None
    finally:
        _config_file.reset(token)
