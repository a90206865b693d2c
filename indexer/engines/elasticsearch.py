"""``SearchEngine`` on an Elasticsearch 8/9 cluster, through the official client.

All the REST logic is shared with OpenSearch in ``cellsight.indexer.engines.http``; this module
only adapts the ``elasticsearch`` client: raw requests, the bulk helper, the point in
time (``_pit``), and its errors, classified here once (``http_errors.from_status``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from elastic_transport import Transport, TransportApiResponse
from elasticsearch import (
    ApiError,
    ConnectionTimeout,
    Elasticsearch,
    SerializationError,
    TransportError,
    UnsupportedProductError,
)
from elasticsearch.helpers import streaming_bulk
from elasticsearch.serializer import OrjsonSerializer

from cellsight.indexer.engines.base import EngineError, EngineTimeout, EngineUnavailable
from cellsight.indexer.engines.http import MAX_CHUNK_BYTES, BulkAction, BulkItem, HttpEngine
from cellsight.indexer.engines.http_core import PIT_KEEP_ALIVE
from cellsight.indexer.engines.http_errors import from_status, json_complaint, not_json


def _as_is(action: BulkAction) -> BulkAction:
    return action


class JsonAnswers(Transport):
    """A 2xx answer whose body is empty or no JSON object or array (a proxy's page) is
    a ``SerializationError``, as a body that does not parse is (see the OpenSearch
    engine's, where an engine probe found the bulk helper stopping the indexer on it)."""

    def perform_request(self, method: str, target: str, **kwargs: Any) -> TransportApiResponse:
        answer = super().perform_request(method, target, **kwargs)
        if (complaint := json_complaint(method, target, answer.body)) is not None:
            raise SerializationError(complaint)
        return answer


class ElasticsearchEngine(HttpEngine):
    """``client_options`` go to ``elasticsearch.Elasticsearch`` (auth, TLS, node_class).

    The client does not retry (``max_retries=0``): the consumer already retries whole
    batches with backoff, and client retries on top would multiply the time a caller
    waits on a dead cluster by the retry count before it can react.
    """

    distribution = "elasticsearch"

    def _make_client(self, url: str, timeout: float, options: dict[str, Any]) -> Elasticsearch:
        defaults: dict[str, Any] = {
            "request_timeout": timeout,
            "max_retries": 0,
            "retry_on_timeout": False,
            # the client's own orjson serializer (bulk lines included): as on OpenSearch
            "serializer": OrjsonSerializer(),
            "transport_class": JsonAnswers,
        }
        if "maxsize" not in options:  # the client refuses both
            defaults["connections_per_node"] = self.pool_connections
        return Elasticsearch(url, **(defaults | options))

    @contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        """The client's exceptions as engine errors, by type and status code."""
        try:
            yield
        except UnsupportedProductError as exc:  # a 2xx without the product header
            raise EngineError(f"{self.url} is not Elasticsearch: {exc}") from exc
        except ApiError as exc:
            raise from_status(exc.meta.status, exc.body, f"elasticsearch {where}") from exc
        except ConnectionTimeout as exc:
            raise EngineTimeout(f"elasticsearch at {self.url}: {exc}") from exc
        except SerializationError as exc:  # a 2xx whose body is no JSON: a proxy between
            raise not_json("elasticsearch", self.url, where, exc) from exc
        except TransportError as exc:  # connection refused or reset, TLS
            raise EngineUnavailable(f"elasticsearch at {self.url}: {exc}") from exc

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        headers = {"accept": "application/json"}
        if body is not None:
            headers["content-type"] = "application/json"
        client = self.client if timeout is None else self.client.options(request_timeout=timeout)
        with self._errors(f"{method} {path}"):
            response = client.perform_request(
                method, path, params=params, headers=headers, body=body
            )
        return response.body

    def _stream_bulk(
        self, actions: Iterable[BulkAction], *, chunk_size: int, timeout: float
    ) -> Iterator[BulkItem]:
        with self._errors("POST /_bulk"):
            yield from streaming_bulk(
                self.client.options(request_timeout=timeout),
                actions,  # type: ignore[arg-type]  # (header, source) pairs, see _as_is
                chunk_size=chunk_size,
                max_chunk_bytes=MAX_CHUNK_BYTES,
                expand_action_callback=_as_is,  # type: ignore[arg-type]
                raise_on_error=False,
                raise_on_exception=True,
                max_retries=0,
            )

    def _open_pit(self, target: str) -> str:
        body = self._send("POST", f"/{target}/_pit", params={"keep_alive": PIT_KEEP_ALIVE})
        return str(body["id"])

    def _close_pit(self, pit: str) -> None:
        self._send("DELETE", "/_pit", body={"id": pit})
