"""Reservations (forthcoming instances), for administrators, addressed by uuid.

* ``POST /v2.1/reservations`` ``{"reservation": {"uuid"?, "name"?, "project_id"?,
  "user_id"?, "flavor"?, "cell"?, "host"?}}`` → 201 ``{"reservation": {...},
  "selections": [...]}`` (the scheduler's picks when a flavor was given; with a host too,
  that host's one Selection, as Nova's scheduler answers a forced host)
* ``PUT /v2.1/reservations/{uuid}`` ``{"reservation": {"name"?, "project_id"?,
  "user_id"?, "flavor"?, "host"?}}`` → 200: only ``name`` is a rename, anything else a
  modify (``null`` clears an attribute)
* ``POST /v2.1/reservations/{uuid}/commit`` → 200: the built instance
* ``DELETE /v2.1/reservations/{uuid}`` → 204: cancelled

The operations publish through ``app.state.publisher`` (built from the settings on
first use: the API needs the bus only when reservations are changed). Errors: 400 for
a bad body, flavor or cell (naming it), 403 for non-administrators, 404 for an unknown
uuid (or a path that is not one), 409 when the uuid is not a reservation, a commit lacks
attributes, or no host has room, 503 (with a request id) when a database is unavailable.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from cellsight.api.auth import Principal, current_principal
from cellsight.api.errors import ApiError, BadRequest, Forbidden, NotFound
from cellsight.api.json_bodies import json_body
from cellsight.api.query2.node_cache import NodeCache
from cellsight.api.query2.nodes import node_cache
from cellsight.cells.errors import (
    CellsError,
    DatabaseUnavailable,
    DuplicateInstance,
    InstanceNotFound,
    NoValidHost,
    UnknownCell,
    UnknownFlavor,
)
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox
from cellsight.cells.reservations import NotForthcoming, ReservationIncomplete, Reservations
from cellsight.cells.text_rules import unprintable
from cellsight.notifications.envelope import Notification
from cellsight.notifications.objects import Selection
from cellsight.notifications.payloads import InstancePayload
from cellsight.notifications.publisher import Publisher

router = APIRouter(tags=["reservations"])
M = TypeVar("M", bound=BaseModel)
_lock = threading.Lock()
Name = Field(
    default=None,
    max_length=255,
    description="Printable characters, as Nova's names: no control character (Unicode "
    "category C) and no line or paragraph separator",
)


class Conflict(ApiError):
    status = 409


class _NoNul(BaseModel):
    """Strings holding only what Nova's name pattern allows (``cells.text_rules``): no
    control character (NUL included, which PostgreSQL's text types cannot hold), no line
    or paragraph separator."""

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if isinstance(value, str) and (char := unprintable(value)) is not None:
            raise ValueError(f"must not hold U+{ord(char):04X} (not a printable character)")
        return value


class NewReservation(_NoNul):
    model_config = ConfigDict(extra="forbid")

    # Every spelling uuid.UUID reads, as the CLI and the paths: braces, urn:uuid:, no hyphens.
    uuid: str | None = Field(default=None, max_length=47)
    name: str | None = Name
    project_id: str | None = Name
    user_id: str | None = Name
    flavor: str | None = Name
    cell: str | None = Name
    host: str | None = Name


class ReservationChange(_NoNul):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Name
    project_id: str | None = Name
    user_id: str | None = Name
    flavor: str | None = Name
    host: str | None = Name


# Documented on every reservation operation (the Fault schema is ``cellsight.api.openapi``'s).
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "description": "Not a reservation, a commit lacking attributes, or no host with room",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Fault"}}},
    }
}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """The route's request body for the OpenAPI document: ``_parse`` reads it by hand (so
    that a bad one is Nova's 400, not FastAPI's 422), where FastAPI cannot see it."""
    schema = {
        "type": "object",
        "properties": {"reservation": model.model_json_schema()},
        "required": ["reservation"],
        "additionalProperties": False,
    }
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


# Seconds a request spends publishing its cell's outbox after its commit, at most (then
# it finishes its batch): after a bus outage the backlog goes with later requests and
# the indexer's periodic relay, not all in one request (64.7 s for 30,000 in a probe).
DELIVER_BUDGET = 1.0


def _reservations(state: State) -> Reservations:
    with _lock:
        if getattr(state, "publisher", None) is None:
            from cellsight.clients import build_notifier

            # Entered on the app's exit stack: its lifespan closes the notifier (and
            # the bus client under it) when the app shuts down.
            state.publisher = state.resources.enter_context(build_notifier(state.settings))
    publisher = _Observed(state.publisher, node_cache(state))
    relay = Outbox(
        publisher, lease_seconds=state.settings.outbox_lease, deliver_budget=DELIVER_BUDGET
    )
    ops = Operations(
        state.registry,
        publisher,
        publisher_id=state.settings.publisher_id,
        default_availability_zone=state.settings.default_availability_zone,
        relay=relay,
    )
    return Reservations(ops)


class _Observed:
    """Publishes, and lets this process's node cache drop what the events changed."""

    def __init__(self, inner: Publisher, cache: NodeCache) -> None:
        self.inner, self.cache = inner, cache

    def publish(self, notification: Notification) -> None:
        self.publish_many([notification])

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        try:
            self.inner.publish_many(notifications)
        finally:  # committed before the publish: drop the entries even if the bus is down
            for n in notifications:
                self.cache.observe(n.event_type, n.payload)


def _admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise Forbidden("Reservations are admin-only")


_JSON_TYPES = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
}


def _parse(model: type[M], raw: bytes) -> M:
    body = json_body(raw or b"null")  # a probe: a 4,301-digit number was "not valid JSON", no more
    if not isinstance(body, dict) or set(body) != {"reservation"}:
        raise BadRequest('The body must be {"reservation": {...}}', parameter="body")
    inner = body["reservation"]
    if not isinstance(inner, dict):  # pydantic's would say "reservation.reservation: ... or
        # instance of NewReservation", a class name the client never sent (a README probe)
        raise BadRequest(
            f"reservation: must be an object, not {_JSON_TYPES.get(type(inner), 'that')}",
            parameter="reservation",
        )
    if extra := sorted(set(inner) - set(model.model_fields)):
        # Named here: a key pydantic cannot read as a string (a lone surrogate) came back
        # without a location, as "reservation.reservation".
        raise BadRequest(
            f"reservation.{extra[0][:40]}: Extra inputs are not permitted", parameter=extra[0]
        )
    try:
        return model.model_validate(inner)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "reservation"
        raise BadRequest(f"reservation.{where}: {err['msg']}", parameter=where) from None


_FIELDS = {"display_name": "name", "tenant_id": "project_id"}  # the row's: the API's (_view)


def _translate(exc: CellsError) -> ApiError:
    """The one place cells errors become answers (never their internals)."""
    if isinstance(exc, InstanceNotFound):
        return NotFound(str(exc))
    if isinstance(exc, UnknownFlavor | UnknownCell):
        return BadRequest(str(exc))
    if isinstance(exc, ReservationIncomplete):  # by the API's field names, not the row's
        named = ", ".join(_FIELDS.get(field, field) for field in exc.missing)
        return Conflict(f"reservation {exc.uuid} cannot be committed without {named}")
    if isinstance(exc, NotForthcoming | NoValidHost | DuplicateInstance):
        return Conflict(str(exc))
    return BadRequest(str(exc))


def _view(payload: InstancePayload) -> dict[str, Any]:
    """The reservation as the API shows it: flat, absent attributes null."""
    data = payload.to_primitive()["nova_object.data"]
    flavor = payload.flavor.name if payload.flavor is not None else None
    return {
        "uuid": data["uuid"],
        "name": data["display_name"],
        "project_id": data["tenant_id"],
        "user_id": data["user_id"],
        "flavor": flavor,
        "cell_uuid": data.get("cell_uuid"),
        "host": data["host"],
        "node": data["node"],
        "availability_zone": data["availability_zone"],
        "state": data["state"],
        "forthcoming": bool(data.get("forthcoming")),
        "revision": data.get("revision"),
        "created_at": data["created_at"],
        "updated_at": data["updated_at"],
    }


def _selection(selection: Selection) -> dict[str, Any]:
    data: dict[str, Any] = selection.to_primitive()["nova_object.data"]
    limits = selection.limits.to_dict() if selection.limits is not None else None
    return {**data, "limits": limits}


def _uuid(value: str) -> str:
    """The path's uuid, normalised; anything else is not found, as in Nova (and is never
    sent to a database: PostgreSQL refuses NUL, MariaDB's ASCII uuid columns non-ASCII)."""
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise NotFound(f"Reservation {value[:60]!r} could not be found.") from None


async def _call(request: Request, fn: Any, *args: Any, **kwargs: Any) -> Any:
    state = request.app.state

    def run() -> Any:
        reservations = _reservations(state)
        try:
            return fn(reservations, *args, **kwargs)
        except DatabaseUnavailable:
            raise  # the app's 503 with a request id; the URL and driver text go to the log
        except CellsError as exc:
            raise _translate(exc) from None
        finally:
            # The nodes committed changes touched, whether or not their notifications
            # were published yet (bus down, or another relay holds the cell's outbox).
            cache = node_cache(state)
            for node, cell in reservations.touched:
                cache.invalidate_node(node, cell)

    return await run_in_threadpool(run)


@router.post(
    "/v2.1/reservations",
    status_code=201,
    summary="Reserve a forthcoming instance",
    openapi_extra=_body(NewReservation),
    responses=CONFLICT,
)
async def reserve(request: Request, principal: Principal = Depends(current_principal)) -> Any:
    _admin(principal)
    body = _parse(NewReservation, await request.body())
    result = await _call(request, Reservations.reserve, **body.model_dump())
    out = {
        "reservation": _view(result.payload),
        "selections": [_selection(s) for s in result.selections],
    }
    return JSONResponse(out, status_code=201)


@router.put(
    "/v2.1/reservations/{uuid}",
    summary="Modify or rename a reservation",
    openapi_extra=_body(ReservationChange),
    responses=CONFLICT,
)
async def modify(
    uuid: str, request: Request, principal: Principal = Depends(current_principal)
) -> Any:
    _admin(principal)
    body = _parse(ReservationChange, await request.body())
    given = body.model_dump(exclude_unset=True)
    if not given:
        raise BadRequest("Nothing to change", parameter="reservation")
    if set(given) == {"name"}:
        payload = await _call(request, Reservations.rename, _uuid(uuid), given["name"])
    else:
        payload = await _call(request, Reservations.modify, _uuid(uuid), **given)
    return JSONResponse({"reservation": _view(payload)})


@router.post(
    "/v2.1/reservations/{uuid}/commit", summary="Build a reserved instance", responses=CONFLICT
)
async def commit(
    uuid: str, request: Request, principal: Principal = Depends(current_principal)
) -> Any:
    _admin(principal)
    payload = await _call(request, Reservations.commit, _uuid(uuid))
    return JSONResponse({"reservation": _view(payload)})


@router.delete(
    "/v2.1/reservations/{uuid}",
    status_code=204,
    summary="Cancel a reservation",
    responses=CONFLICT,
)
async def cancel(
    uuid: str, request: Request, principal: Principal = Depends(current_principal)
) -> Response:
    _admin(principal)
    await _call(request, Reservations.cancel, _uuid(uuid))
    return Response(status_code=204)
