"""``SearchEngine`` on an OpenSearch 2/3 cluster, through ``opensearch-py``.

All the REST logic is shared with Elasticsearch in ``cellsight.indexer.engines.http``; this module
only adapts the ``opensearchpy`` client: raw requests, the bulk helper, the point in
time (``_search/point_in_time``), and its errors, classified here once
(``http_errors.from_status``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from opensearchpy import (
    ConnectionError,
    ConnectionTimeout,
    OpenSearch,
    SerializationError,
    Transport,
    TransportError,
)
from opensearchpy.helpers import streaming_bulk
from opensearchpy.serializer import JSONSerializer

from cellsight.indexer.engines.base import EngineTimeout, EngineUnavailable
from cellsight.indexer.engines.http import MAX_CHUNK_BYTES, BulkAction, BulkItem, HttpEngine
from cellsight.indexer.engines.http_core import PIT_KEEP_ALIVE
from cellsight.indexer.engines.http_errors import from_status, json_complaint, not_json


def _as_is(action: BulkAction) -> BulkAction:
    return action


class OrjsonSerializer(JSONSerializer):
    """orjson for bulk lines and answers: the stdlib encoder was the writer thread's
    largest Python cost on the HTTP path (profiled against the null bulk endpoint).
    Whatever orjson refuses (an integer past 64 bits, a lone surrogate) takes the
    client's own serializer as before."""

    def dumps(self, data: Any) -> Any:
        if isinstance(data, str):
            return data
        try:
            return orjson.dumps(data).decode()
        except TypeError:
            return super().dumps(data)

    def loads(self, s: str) -> Any:
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError:
            return super().loads(s)


class JsonAnswers(Transport):
    """A 2xx answer whose body is empty or no JSON object or array (a proxy's page, a
    truncated answer that still parses) is a ``SerializationError``, as a body that does
    not parse is: the client handed it on, and the bulk helper then failed on it with a
    ``TypeError`` that stopped the indexer (an engine probe)."""

    def perform_request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        answer = super().perform_request(method, url, *args, **kwargs)
        if (complaint := json_complaint(method, url, answer)) is not None:
            raise SerializationError(complaint)
        return answer


class OpenSearchEngine(HttpEngine):
    """``client_options`` go to ``opensearchpy.OpenSearch`` (auth, TLS, connection_class).

    The client does not retry (``max_retries=0``): the consumer already retries whole
    batches with backoff, and client retries on top would multiply the time a caller
    waits on a dead cluster by the retry count before it can react.
    """

    distribution = "opensearch"

    def _make_client(self, url: str, timeout: float, options: dict[str, Any]) -> OpenSearch:
        defaults: dict[str, Any] = {
            "timeout": timeout,
            "max_retries": 0,
            "retry_on_timeout": False,
            "serializer": OrjsonSerializer(),
            "pool_maxsize": self.pool_connections,
            "transport_class": JsonAnswers,
        }
        return OpenSearch(hosts=[url], **(defaults | options))

    @contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        """The client's exceptions as engine errors, by type and status code."""
        try:
            yield
        except ConnectionTimeout as exc:
            raise EngineTimeout(f"opensearch at {self.url}: {exc}") from exc
        except SerializationError as exc:  # a 2xx whose body is no JSON: a proxy between
            raise not_json("opensearch", self.url, where, exc) from exc
        except TransportError as exc:
            # "no answer" (refused, reset, timeout) is a ConnectionError with status "N/A"
            if isinstance(exc, ConnectionError) or not isinstance(exc.status_code, int):
                raise EngineUnavailable(f"opensearch at {self.url}: {exc}") from exc
            raise from_status(exc.status_code, exc.info, f"opensearch {where}") from exc

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        with self._errors(f"{method} {path}"):
            return self.client.transport.perform_request(
                method, path, params=params, body=body, timeout=timeout
            )

    def _stream_bulk(
        self, actions: Iterable[BulkAction], *, chunk_size: int, timeout: float
    ) -> Iterator[BulkItem]:
        with self._errors("POST /_bulk"):
            yield from streaming_bulk(
                self.client,
                actions,
                chunk_size=chunk_size,
                max_chunk_bytes=MAX_CHUNK_BYTES,
                expand_action_callback=_as_is,
                raise_on_error=False,
                raise_on_exception=True,
                max_retries=0,
                request_timeout=timeout,
            )

    def _open_pit(self, target: str) -> str:
        path = f"/{target}/_search/point_in_time"
        body = self._send("POST", path, params={"keep_alive": PIT_KEEP_ALIVE})
        return str(body["pit_id"])

    def _close_pit(self, pit: str) -> None:
        self._send("DELETE", "/_search/point_in_time", body={"pit_id": [pit]})
