"""The compiled decoder is generated from the payload models: same fields, same
defaults, bounds from ``cellsight.notifications.limits``; realistic notifications take it."""

from __future__ import annotations

import msgspec
import pytest

from cellsight.indexer.planning import Planned, plan_fast
from cellsight.notifications import fastdecode, limits
from cellsight.notifications.fastdecode import FAST_CLASSES, decode_fast
from tests.support import novagen


@pytest.mark.parametrize("model", FAST_CLASSES, ids=lambda m: m.__name__)
def test_structs_have_the_models_fields_and_defaults(model: type) -> None:
    struct = next(s for s, m in fastdecode._TOPS.items() if m is model)
    data = next(f.type for f in msgspec.structs.fields(struct) if f.name == "data")
    fields = {f.name: f for f in msgspec.structs.fields(data)}
    assert list(fields) == list(model.model_fields)
    for name, info in model.model_fields.items():
        f = fields[name]
        if info.is_required():
            assert f.required, name
        elif info.default_factory is not None:
            assert f.default_factory() == info.default_factory(), name  # type: ignore[call-arg]
        else:
            assert f.default == info.default, name


@pytest.mark.parametrize("name", sorted(novagen.sample_set()))
@pytest.mark.parametrize("wrapped", [True, False])
def test_realistic_notifications_take_the_compiled_path(name: str, wrapped: bool) -> None:
    body = novagen.body(novagen.sample_set()[name], wrapped=wrapped)
    result = plan_fast(0, body)
    if name == "service-update":
        assert result is None  # a class read verbatim: the reference decides
    else:
        assert isinstance(result, Planned), name


def test_bounds_come_from_the_limits() -> None:
    body = novagen.notification(seed=3)
    body["payload"]["nova_object.data"]["display_name"] = "n" * limits.NAME_LENGTH
    assert decode_fast(novagen.body(body)).data.display_name == "n" * limits.NAME_LENGTH
    body["payload"]["nova_object.data"]["display_name"] += "n"
    with pytest.raises(msgspec.ValidationError, match="display_name"):
        decode_fast(novagen.body(body))
