"""Engines for the indexer benchmarks: fresh, empty ones per phase, cleaned up after."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.nullbulk import NullBulkServer
from cellsight.indexer.engines.base import SearchEngine


class EngineSite:
    """Hands out fresh, empty engines (several may be live at once) and cleans up."""

    name = "?"

    def fresh(self, phase: str) -> SearchEngine:
        raise NotImplementedError

    def release(self, engine: SearchEngine) -> None:
        engine.close()

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {}

    def cli_env(self, tag: str, data_dir: Path) -> dict[str, str]:
        """Environment for ``cellsight indexer`` writing into engine ``tag``."""
        raise NotImplementedError

    def cli_engine(self, tag: str, data_dir: Path) -> SearchEngine:
        """The engine ``cli_env(tag)`` makes the command write into."""
        raise NotImplementedError


class EmbeddedSite(EngineSite):
    name = "embedded"

    def __init__(self, root: Path) -> None:
        from cellsight.indexer.engines.embedded import EmbeddedEngine

        self.cls = EmbeddedEngine
        self.root = Path(tempfile.mkdtemp(prefix="cellsight-bench-", dir=root))

    def fresh(self, phase: str) -> SearchEngine:
        engine = self.cls(self.root / f"{phase}.db", prefix="bench")
        engine.ensure_ready("instance")
        engine.ensure_ready("node")
        return engine

    def release(self, engine: SearchEngine) -> None:
        engine.close()
        path = Path(engine.path)  # type: ignore[attr-defined]
        for p in path.parent.glob(path.name + "*"):
            p.unlink()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.root), "synchronous": "NORMAL (engine default)"}

    def cli_env(self, tag: str, data_dir: Path) -> dict[str, str]:
        return {}  # the embedded index in --data-dir

    def cli_engine(self, tag: str, data_dir: Path) -> SearchEngine:
        from cellsight.settings import load_settings

        return self.cls(load_settings(data_dir=data_dir).index_path)


class OsmemSite(EngineSite):
    """One osmem server per engine benchmark; each engine its own prefix, its indexes
    dropped on release (osmem holds ~16 KB per document in memory)."""

    name = "osmem"

    def __init__(self) -> None:
        from osmem_server import OsmemServer

        from cellsight.indexer.engines.opensearch import OpenSearchEngine

        self.cls = OpenSearchEngine
        self.server: Any = OsmemServer.start(japanese=False)

    def fresh(self, phase: str) -> SearchEngine:
        engine = self.cls(self.server.url, prefix=f"bench-{phase}", timeout=60.0)
        engine.ensure_ready("instance")
        engine.ensure_ready("node")
        return engine

    def release(self, engine: SearchEngine) -> None:
        with contextlib.suppress(Exception):
            for resource in ("instance", "node"):
                for info in engine.indexes(resource):
                    engine.drop_index(info.name)
        engine.close()

    def close(self) -> None:
        self.server.close()

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"server": "osmem-server", "version": version("osmem-server")}

    def cli_env(self, tag: str, data_dir: Path) -> dict[str, str]:
        return {"CELLSIGHT_SEARCH_URL": self.server.url, "CELLSIGHT_INDEX_PREFIX": f"bench-{tag}"}

    def cli_engine(self, tag: str, data_dir: Path) -> SearchEngine:
        return self.cls(self.server.url, prefix=f"bench-{tag}", timeout=60.0)


class NullBulkSite(EngineSite):
    """``OpenSearchEngine`` against the null bulk endpoint (``bench.nullbulk``)."""

    name = "nullbulk"

    def __init__(self) -> None:
        from cellsight.indexer.engines.opensearch import OpenSearchEngine

        self.cls = OpenSearchEngine
        self.server = NullBulkServer.start()

    def fresh(self, phase: str) -> SearchEngine:
        engine = self.cls(self.server.url, prefix=f"bench-{phase}", timeout=60.0)
        engine.ensure_ready("instance")
        engine.ensure_ready("node")
        return engine

    def close(self) -> None:
        self.server.close()

    def describe(self) -> dict[str, Any]:
        return {"server": "null bulk endpoint (scripts/bench/nullbulk.py)", "url": self.server.url}

    def cli_env(self, tag: str, data_dir: Path) -> dict[str, str]:
        return {"CELLSIGHT_SEARCH_URL": self.server.url, "CELLSIGHT_INDEX_PREFIX": f"bench-{tag}"}

    def cli_engine(self, tag: str, data_dir: Path) -> SearchEngine:
        return self.cls(self.server.url, prefix=f"bench-{tag}", timeout=60.0)
