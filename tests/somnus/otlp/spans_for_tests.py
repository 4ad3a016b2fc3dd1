"""Spans of the shapes runtimes emit, built by hand for the unit tests (the integration tests use the SDK)."""

from __future__ import annotations

from typing import Any

from somnus.otlp.spans import Span, SpanEvent

T0 = 1_716_000_000 * 10**9  # 2024-05-18 02:40:00 UTC
S = 10**9


def span(
    span_id: str,
    name: str,
    start_s: float,
    end_s: float,
    parent: str = "",
    trace: str = "ab" * 16,
    status: int = 0,
    message: str = "",
    events: list[SpanEvent] | None = None,
    **attributes: Any,
) -> Span:
    """A span of ``trace`` (ids are padded to 16 hex digits); attribute names with ``__`` for dots."""
    return Span(
        trace_id=trace,
        span_id=span_id.rjust(16, "0"),
        parent_span_id=parent.rjust(16, "0") if parent else "",
        name=name,
        start_ns=T0 + int(start_s * S),
        end_ns=T0 + int(end_s * S),
        attributes={k.replace("__", "."): v for k, v in attributes.items()},
        status_code=status,
        status_message=message,
        events=events or [],
        resource={"service.name": "shop"},
    )
