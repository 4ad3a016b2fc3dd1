"""ForgetRequested: a round trip through JSON keeps every value; out-of-range fields are refused."""

from __future__ import annotations

from datetime import timezone

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from somnus.schemas.forget import ForgetRequested, ForgetSubject

requests = st.builds(
    ForgetRequested,
    request_id=st.text(min_size=1, max_size=200),
    subject=st.sampled_from(ForgetSubject),
    value=st.text(min_size=1, max_size=500),
    at=st.datetimes(timezones=st.just(timezone.utc)),
    reason=st.none() | st.text(max_size=2000),
)


@given(requests)
def test_round_trip(req):
    assert msgspec.json.decode(msgspec.json.encode(req), type=ForgetRequested) == req


@pytest.mark.parametrize(
    "field, value", [("value", ""), ("request_id", ""), ("subject", "tenant"), ("value", "x" * 501)]
)
def test_out_of_range_is_refused(field, value):
    body = {"request_id": "r", "subject": "user", "value": "u1", "at": "2024-05-15T00:00:00Z", field: value}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(body), type=ForgetRequested)
