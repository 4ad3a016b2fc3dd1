"""somnus.processors.knowledge.extraction: the trace extractor states only what the trace says, deterministically."""

from __future__ import annotations

import re
import uuid
import warnings
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from somnus.importers import openai_chat
from somnus.processors.knowledge import extraction
from somnus.processors.knowledge.extraction import (
    CLIENT_KEYS,
    MAX_ERROR_CLASS,
    MAX_EXAMPLE,
    MAX_FACTS,
    PROJECT_KEYS,
    RATE_TYPE,
    TRACE_EXTRACTOR_NAME,
    EntityExtractor,
    TraceExtractor,
    error_class,
    rate_value,
)
from somnus.processors.sessions.distiller import distill
from somnus.schemas.codec import Rejection, decode_trace, encode
from somnus.schemas.episodes import CallSeen, Delegation, EpisodeDistilled, ErrorSeen
from somnus.schemas.events import Outcome
from somnus.schemas.facts import FACTS_SCHEMA_VERSION, FactAsserted, FactsExtracted
from tests.tau_bench import raw_tau_counts, tau_group

T0 = datetime(2024, 5, 15, 20, 0, tzinfo=timezone.utc)


def episode(
    calls: list[CallSeen] | None = None,
    *,
    outcome: Outcome = Outcome.SUCCESS,
    agent: str = "support",
    n: int = 1,
    delegations: list[Delegation] | None = None,
    metadata: dict[str, Any] | None = None,
    tools: list[str] | None = None,
    errors: list[ErrorSeen] | None = None,
) -> EpisodeDistilled:
    calls = calls or []
    return EpisodeDistilled(
        episode_id=uuid.UUID(int=n),
        schema_version=1,
        agent=agent,
        session_id=f"s{n}",
        task="t",
        goal=None,
        user_id=None,
        summary="",
        outcome=outcome,
        started_at=T0,
        ended_at=T0 + timedelta(seconds=n),
        duration_s=float(n),
        event_count=2 + 2 * len(calls),
        tool_calls=len(calls),
        tools=tools if tools is not None else list(dict.fromkeys(c.tool for c in calls)),
        errors=errors or [],
        lessons=[],
        delegations=delegations or [],
        first_event_id=uuid.UUID(int=1000 + n),
        last_event_id=uuid.UUID(int=2000 + n),
        calls=calls,
        metadata=metadata or {},
    )


def ok(tool: str, **kw: Any) -> CallSeen:
    return CallSeen(tool=tool, ok=True, **kw)


def failed(tool: str, error: str, **kw: Any) -> CallSeen:
    return CallSeen(tool=tool, ok=False, error=error, **kw)


def extract_one(ep: EpisodeDistilled) -> FactsExtracted:
    [out] = TraceExtractor().extract([ep])
    return out


def triples(ep: EpisodeDistilled, predicate: str | None = None) -> list[tuple[str, str, str, int]]:
    return [
        (f.source, f.predicate, f.target, f.count)
        for f in extract_one(ep).facts
        if predicate is None or f.predicate == predicate
    ]


def fact(ep: EpisodeDistilled, predicate: str) -> FactAsserted:
    [f] = [f for f in extract_one(ep).facts if f.predicate == predicate]
    return f


# ---- error classes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # tau-bench
        ("Error: flight HAT030 not available on date 2024-05-13", "flight <id> not available on date <date>"),
        ("Error: flight HAT271 not available on date 2024-05-10", "flight <id> not available on date <date>"),
        ("Error: gift card balance is not enough", "gift card balance is not enough"),
        ("Error: not enough seats on flight HAT290", "not enough seats on flight <id>"),
        ("Error: certificate cannot be used to update reservation", "certificate cannot be used to update reservation"),
        ("Error: payment method not found", "payment method not found"),
        (
            "Error: payment amount does not add up, total price is 1203, but paid 833",
            "payment amount does not add up, total price is <n>, but paid <n>",
        ),
        ("Error: payment method certificate_7504069 not found", "payment method <id> not found"),
        ("Error: not enough balance in payment method gift_card_5094406", "not enough balance in payment method <id>"),
        # prefixes
        ("error: user not found", "user not found"),
        ("ERROR: Error: user not found", "user not found"),
        ("  Error:\n  user   not found.  ", "user not found"),
        # HTTP statuses
        ("HTTP 429: Too Many Requests", "HTTP 429: Too Many Requests"),
        ("HTTP 429", "HTTP 429"),
        ("HTTP 500: Error: upstream 10.0.0.7 timed out", "HTTP 500: upstream <n> timed out"),
        ("HTTP/1.1 503 Service Unavailable", "HTTP 503: Service Unavailable"),
        ("HTTP Error 404: Not Found", "HTTP 404: Not Found"),
        ("429 Too Many Requests", "HTTP 429: Too Many Requests"),
        ("Error: 502: bad gateway", "HTTP 502: bad gateway"),
        ("Error: 500 seats requested", "<n> seats requested"),  # a number, not a status
        # shells
        ("bash: helm: command not found", "command not found: helm"),
        ("bash: line 1: kubectl: command not found", "command not found: kubectl"),
        ("zsh: command not found: helm", "command not found: helm"),
        ("/bin/sh: 1: helm: not found", "command not found: helm"),
        # exceptions: the class is kept, its message templated
        ("ValueError: x must be positive", "ValueError: x must be positive"),
        ("ValueError: x must be positive, got -3", "ValueError: x must be positive, got -<n>"),
        ("KeyError: 'user_42'", "KeyError: '<id>'"),
        (
            'Traceback (most recent call last): File "/app/run.py", line 3, in <module> main() ValueError: bad row 17',
            "ValueError: bad row <n>",
        ),
        ('Traceback (most recent call last): File "/app/run.py", line 3, in <mod', "traceback (exception not shown)"),
        (
            "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: https://api.x.io/v1/u/12",
            "requests.exceptions.HTTPError: <n> Client Error: Not Found for url: <url>",
        ),
        # placeholders
        ("user 550e8400-e29b-41d4-a716-446655440000 not found", "user <id> not found"),
        ("job failed at 2024-05-13T10:00:00Z", "job failed at <date>"),
        ("job failed on 5/13/2024 at 10:32:07", "job failed on <date> at <time>"),
        ("commit deadbeef1234 missing, pointer 0x7ffe", "commit <id> missing, pointer <id>"),
        ("No such file or directory: '/tmp/run-7/out.txt'", "No such file or directory: '<path>'"),
        ("timeout after 30.5 seconds (limit 1,000)", "timeout after <n> seconds (limit <n>)"),
        ("mail to bob@example.com bounced", "mail to <email> bounced"),
        ("rate limit of 10 requests per second exceeded", "rate limit of <n> requests per second exceeded"),
        ("I/O error and/or 10 req/s", "I/O error and/or <n> req/s"),
        # nothing to say
        ("", "error (no message)"),
        ("Error:", "error (no message)"),
        # a data payload (a response body, maybe cut) is its message, or <data>
        # ToolBench's server: "Message error..." (the response said "error" somewhere) + the response, cut
        (
            "Message error... {'result': [{'type': 'series', 'title': 'Black Summer', 'overview': 'In the dark, ea",
            "Message error... <data>",
        ),
        (
            "Message error... {'feed': {'html': {'lang': 'en'}}, 'main': {'id': 'af-error-container'}}",
            "Message error... <data>",
        ),
        # a payload that says its message: the message is the class
        (
            "Message error... {'statusCode': 400, 'error': 'Bad Request', 'message': 'Bad query'}",
            "Message error... Bad query",
        ),
        ('HTTP 400: {"error": {"code": 400, "message": "API key not valid"}}', "HTTP 400: API key not valid"),
        ('HTTP 422: {"detail": [{"loc": ["body", "q"], "msg": "field required"}]}', "HTTP 422: field required"),
        ('{"errors": [], "error": "user 42 not found"} (attempt 3)', "user <n> not found (attempt <n>)"),
        ("expected one of ['json', 'yaml']", "expected one of <data>"),
        # not payloads: indexing, errno tags, format fields, empty brackets
        ("KeyError in row['name']", "KeyError in row['name']"),
        ("[Errno 2] No such file or directory", "[Errno <n>] No such file or directory"),
        ("template field {name} is missing, got {} and []", "template field {name} is missing, got {} and []"),
    ],
)
def test_error_class(text: str, expected: str) -> None:
    assert error_class(text) == expected


def test_the_same_failure_with_other_response_bodies_is_one_class() -> None:
    """A tool whose failure carries the response body it got (each call its own data) fails one way,
    so that the failure can recur, group into one lesson and be foretold."""
    a = "Message error... {'result': [{'title': 'Black Summer', 'overview': 'In the dark, early days of a"
    b = "Message error... {'result': [{'title': 'The Walking Dead', 'overview': 'Sheriff Deputy Rick Grimes"
    assert error_class(a) == error_class(b) == error_class(error_class(a))


def test_a_payload_class_does_not_depend_on_the_warning_filters() -> None:
    """A Python-literal payload with an invalid escape ("\\d") warns when parsed; under ``-W error``
    that would make it <data> in one process and its message in another."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert error_class("HTTP 400: {'message': 'no match for \\d+ in q'}") == "HTTP 400: no match for \\d+ in q"


def test_an_error_class_is_cut_at_max_error_class() -> None:
    assert MAX_ERROR_CLASS == 160
    assert error_class("Error: " + "x" * 1000) == "x" * MAX_ERROR_CLASS


_IDS = st.from_regex(r"[A-Z]{2,4}[0-9]{2,6}|[a-z]{1,12}_[0-9]{3,8}|[0-9]{1,3}[a-z][0-9a-z]{0,8}", fullmatch=True)


@given(
    a=_IDS,
    b=_IDS,
    day=st.dates().map(lambda d: f"{d.year:04d}-{d.month:02d}-{d.day:02d}"),
    u=st.uuids(),
    n=st.integers(0, 10**9),
)
@example(a="HAT030", b="gift_card_5094406", day="2024-05-13", u=uuid.UUID(int=0), n=0)
def test_the_same_error_with_other_ids_numbers_and_dates_is_one_class(
    a: str, b: str, day: str, u: uuid.UUID, n: int
) -> None:
    template = "Error: flight {} not available on date {} for {} (request {}, paid {})"
    assert error_class(template.format(a, day, b, u, n)) == error_class(
        template.format("HAT271", "2024-05-10", "certificate_1", uuid.UUID(int=7), 5)
    )


@given(st.text(max_size=400))
def test_error_class_is_total_bounded_and_stable(text: str) -> None:
    c = error_class(text)
    assert 0 < len(c) <= MAX_ERROR_CLASS
    assert c == c.strip()
    assert error_class(text) == c


# Text made mostly of what payloads are made of: brackets, quotes, escapes, keys and separators, so that
# the payload reader meets unbalanced, cut, nested and escaped payloads and Python literals it rejects.
PAYLOAD_PIECES = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        "'",
        '"',
        "\\",
        ":",
        ",",
        " ",
        "'message'",
        '"error"',
        "detail",
        "1e9999",
        "9" * 30,
        "b'x'",
        "**",
        "...",
        "Errno 2",
        "\\u",
        "\\x",
        "(",
        ")",
        "set()",
        "None",
        "1j",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PAYLOAD_PIECES, max_size=80).map("".join))
def test_error_class_is_total_on_bracket_heavy_text(text: str) -> None:
    c = error_class(text)
    assert 0 < len(c) <= MAX_ERROR_CLASS and c == c.strip() and error_class(text) == c


# ---- the contract ------------------------------------------------------------------------------


def test_one_facts_extracted_per_episode_in_order_even_when_empty() -> None:
    eps = [episode([ok("a")], n=3, agent="x"), episode([], n=1, agent="y"), episode([ok("b")], n=2, agent="z")]
    out = TraceExtractor().extract(eps)
    assert [f.episode_id for f in out] == [e.episode_id for e in eps]
    assert [f.agent for f in out] == ["x", "y", "z"]
    assert [f.observed_at for f in out] == [e.ended_at for e in eps]
    assert {f.extractor for f in out} == {TRACE_EXTRACTOR_NAME} == {"trace/1"}
    assert {f.schema_version for f in out} == {FACTS_SCHEMA_VERSION}
    assert out[1].facts == [] and [(e.name, e.type) for e in out[1].entities] == [("y", "agent")]
    assert TraceExtractor().extract([]) == []


def test_the_trace_extractor_is_an_entity_extractor() -> None:
    extractor: EntityExtractor = TraceExtractor()
    assert extractor.name == "trace/1"


def test_confidences_are_pinned() -> None:
    assert (extraction.CONFIDENCE_USES, extraction.CONFIDENCE_DELEGATES_TO) == (1.0, 1.0)
    assert (extraction.CONFIDENCE_CALLS, extraction.CONFIDENCE_FAILED_WITH) == (0.95, 0.95)
    assert (
        extraction.CONFIDENCE_RATE_HEADER,
        extraction.CONFIDENCE_RATE_TEXT,
        extraction.CONFIDENCE_RATE_RETRY_AFTER,
    ) == (1.0, 0.95, 0.9)
    assert (extraction.CONFIDENCE_WORKS_ON, extraction.CONFIDENCE_SERVES) == (0.9, 0.9)
    assert extraction.CONFIDENCE_DEPENDS_ON == 0.65
    assert (MAX_FACTS, MAX_EXAMPLE, extraction.MAX_NAME) == (200, 200, 200)


def rich_episode() -> EpisodeDistilled:
    return episode(
        [
            ok("get_user", hosts=["api.example.com"]),
            failed(
                "post_lead",
                "HTTP 429: Too Many Requests",
                http_status=429,
                hosts=["api.instantly.ai"],
                rate_headers={"x-ratelimit-limit": "10", "x-ratelimit-window": "1s"},
            ),
            ok("post_lead", hosts=["api.instantly.ai"]),
            ok("get_user"),
            CallSeen(tool="send_mail"),  # no result: used, not failed
        ],
        delegations=[Delegation(to_agent="researcher", task="find")],
        metadata={"project": "crm-sync", "client": "Acme"},
    )


def test_direct_assertions_are_090_to_100_and_inferences_060_to_070() -> None:
    facts = extract_one(rich_episode()).facts
    assert {f.predicate for f in facts} == {
        "uses",
        "calls",
        "failed_with",
        "rate_limit",
        "delegates_to",
        "works_on",
        "serves",
        "depends_on",
    }
    for f in facts:
        assert (0.6 <= f.confidence <= 0.7) if f.predicate == "depends_on" else (0.9 <= f.confidence <= 1.0), f
        assert re.fullmatch(r"[a-z]+(?:_[a-z]+)*", f.predicate)
        assert f.scope is None
        assert f.functional is (True if f.predicate == "rate_limit" else None)


def test_every_fact_end_is_an_entity_listed_once_agent_first() -> None:
    out = extract_one(rich_episode())
    nodes = [(e.name, e.type) for e in out.entities]
    assert nodes[0] == ("support", "agent")
    assert len(nodes) == len(set(nodes))
    ends = {(f.source, f.source_type) for f in out.facts} | {(f.target, f.target_type) for f in out.facts}
    assert ends == set(nodes)
    assert {t for _, t in nodes} == {"agent", "tool", "api", "error", RATE_TYPE, "project", "client"}


# ---- fact rules --------------------------------------------------------------------------------


def test_the_agent_uses_each_tool_once_counted_by_calls() -> None:
    ep = episode([ok("a"), ok("b"), failed("a", "Error: x"), CallSeen(tool="a")])
    assert triples(ep, "uses") == [("support", "uses", "a", 3), ("support", "uses", "b", 1)]
    assert {f.confidence for f in extract_one(ep).facts if f.predicate == "uses"} == {1.0}
    assert [e.name for e in extract_one(ep).entities if e.type == "tool"] == ["a", "b"]


def test_tools_past_the_listed_calls_are_still_used() -> None:
    ep = episode([ok("a")], tools=["a", "z"])
    assert triples(ep, "uses") == [("support", "uses", "a", 1), ("support", "uses", "z", 1)]


def test_failed_calls_become_failed_with_their_error_class() -> None:
    ep = episode(
        [
            failed("update", "Error: flight HAT030 not available on date 2024-05-13"),
            failed("update", "Error: flight HAT271 not available on date 2024-05-10"),
            failed("update", "Error: gift card balance is not enough"),
            failed("book", "Error: gift card balance is not enough"),
            CallSeen(tool="update"),  # no result: not a failure
            ok("update"),
        ]
    )
    assert triples(ep, "failed_with") == [
        ("update", "failed_with", "flight <id> not available on date <date>", 2),
        ("update", "failed_with", "gift card balance is not enough", 1),
        ("book", "failed_with", "gift card balance is not enough", 1),
    ]
    out = extract_one(ep)
    assert {f.confidence for f in out.facts if f.predicate == "failed_with"} == {0.95}
    errors = [e for e in out.entities if e.type == "error"]
    assert [e.name for e in errors] == ["flight <id> not available on date <date>", "gift card balance is not enough"]
    assert errors[0].attributes == {"example": "Error: flight HAT030 not available on date 2024-05-13"}


def test_error_entities_carry_the_first_example_cut_and_the_http_status() -> None:
    long = "HTTP 503: " + "upstream down " * 40
    ep = episode([failed("a", long), failed("a", long, http_status=503)])
    [err] = [e for e in extract_one(ep).entities if e.type == "error"]
    assert err.attributes == {"example": long[:MAX_EXAMPLE], "http_status": 503}
    assert len(err.attributes["example"]) == MAX_EXAMPLE


def test_a_failed_call_without_a_message_still_has_a_class() -> None:
    assert triples(episode([CallSeen(tool="a", ok=False)]), "failed_with") == [
        ("a", "failed_with", "error (no message)", 1)
    ]


def test_tools_call_the_hosts_of_their_url_arguments() -> None:
    ep = episode([ok("fetch", hosts=["a.io", "b.io"]), ok("fetch", hosts=["a.io"]), ok("post", hosts=["a.io"])])
    assert triples(ep, "calls") == [
        ("fetch", "calls", "a.io", 2),
        ("fetch", "calls", "b.io", 1),
        ("post", "calls", "a.io", 1),
    ]
    assert {f.confidence for f in extract_one(ep).facts if f.predicate == "calls"} == {0.95}
    assert [e.name for e in extract_one(ep).entities if e.type == "api"] == ["a.io", "b.io"]


@pytest.mark.parametrize(
    "headers, value",
    [
        ({"x-ratelimit-limit": "10", "x-ratelimit-window": "1s"}, "10/s"),
        ({"x-ratelimit-limit": "100", "x-ratelimit-window": "60"}, "100/min"),
        ({"x-ratelimit-limit": "5000", "x-ratelimit-interval": "1 hour"}, "5000/h"),
        ({"x-ratelimit-limit": "5", "x-ratelimit-window": "30s"}, "5/30s"),
        ({"ratelimit-policy": "100;w=60"}, "100/min"),
        ({"ratelimit-limit": "10, 10;w=1"}, "10/s"),
        ({"x-ratelimit-limit": "10"}, "10/window"),
        ({"ratelimit-policy": "10;w=0"}, "10/window"),
        ({"x-ratelimit-limit": "10", "x-ratelimit-reset": "1715803200"}, "10/window"),  # reset is not a window
    ],
)
def test_rate_limit_from_headers(headers: dict[str, str], value: str) -> None:
    f = fact(episode([ok("post", hosts=["api.x.io"], rate_headers=headers)]), "rate_limit")
    assert (f.source, f.source_type, f.target, f.target_type) == ("api.x.io", "api", value, RATE_TYPE)
    assert (f.confidence, f.functional) == (1.0, True)


@pytest.mark.parametrize(
    "error, value",
    [
        ("HTTP 429: rate limit of 10 requests per second exceeded", "10/s"),
        ("HTTP 429: slow down, 10 req/s", "10/s"),
        ("Rate limit exceeded: 100 calls per 60 seconds", "100/min"),
        ("Error: throttled, limit 5 per minute", "5/min"),
    ],
)
def test_rate_limit_from_error_text(error: str, value: str) -> None:
    f = fact(episode([failed("post", error, hosts=["api.x.io"])]), "rate_limit")
    assert (f.source, f.target, f.confidence, f.functional) == ("api.x.io", value, 0.95, True)


def test_rate_limit_from_retry_after_only_on_rate_limited_calls() -> None:
    f = fact(
        episode(
            [
                failed(
                    "post",
                    "HTTP 429: Too Many Requests",
                    http_status=429,
                    hosts=["api.x.io"],
                    rate_headers={"retry-after": "2"},
                )
            ]
        ),
        "rate_limit",
    )
    assert (f.target, f.confidence) == ("retry after 2s", 0.9)
    assert (
        triples(
            episode([failed("post", "HTTP 503: down", http_status=503, rate_headers={"retry-after": "2"})]),
            "rate_limit",
        )
        == []
    )
    assert (
        triples(
            episode(
                [
                    failed(
                        "post",
                        "HTTP 429",
                        http_status=429,  # an HTTP-date needs a clock
                        rate_headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"},
                    )
                ]
            ),
            "rate_limit",
        )
        == []
    )


def test_a_call_stating_one_rate_twice_counts_once_at_its_strongest() -> None:
    f = fact(
        episode(
            [
                failed(
                    "post",
                    "HTTP 429: limit of 10 requests per second",
                    http_status=429,
                    hosts=["a.io"],
                    rate_headers={"x-ratelimit-limit": "10", "x-ratelimit-window": "1"},
                )
            ]
        ),
        "rate_limit",
    )
    assert (f.target, f.count, f.confidence) == ("10/s", 1, 1.0)


def test_rate_limit_without_a_host_is_stated_of_the_tool() -> None:
    f = fact(episode([failed("post_lead", "HTTP 429: limit of 10 requests per second", http_status=429)]), "rate_limit")
    assert (f.source, f.source_type, f.target) == ("post_lead", "tool", "10/s")


def test_rate_limit_is_one_value_per_source_the_strongest_then_the_latest() -> None:
    ep = episode(
        [
            failed("post", "HTTP 429: limit of 5 requests per second", http_status=429, hosts=["a.io"]),
            ok("post", hosts=["a.io"], rate_headers={"x-ratelimit-limit": "10", "x-ratelimit-window": "1"}),
            ok("post", hosts=["a.io"], rate_headers={"x-ratelimit-limit": "10", "x-ratelimit-window": "1"}),
            failed("post", "HTTP 429: limit of 7 requests per second", http_status=429, hosts=["b.io"]),
            failed("post", "HTTP 429: limit of 8 requests per second", http_status=429, hosts=["b.io"]),
        ]
    )
    assert [
        (f.source, f.target, f.count, f.confidence) for f in extract_one(ep).facts if f.predicate == "rate_limit"
    ] == [("a.io", "10/s", 2, 1.0), ("b.io", "8/s", 1, 0.95)]


def test_rate_value_spelling() -> None:
    assert [
        rate_value("10", 1),
        rate_value("100", 60),
        rate_value("1000", 3600),
        rate_value("3", 86400),
        rate_value("5", 30),
        rate_value("5", 120),
        rate_value("2.5", 0.5),
        rate_value("10", None),
    ] == ["10/s", "100/min", "1000/h", "3/day", "5/30s", "5/2min", "2.5/0.5s", "10/window"]


def test_delegations_count_per_target() -> None:
    ep = episode(
        [],
        delegations=[
            Delegation(to_agent="researcher", task="a"),
            Delegation(to_agent="writer", task="b"),
            Delegation(to_agent="researcher", task="c", outcome=Outcome.FAILURE),
        ],
    )
    assert triples(ep, "delegates_to") == [
        ("support", "delegates_to", "researcher", 2),
        ("support", "delegates_to", "writer", 1),
    ]
    assert fact(episode([], delegations=[Delegation(to_agent="r", task="")]), "delegates_to").confidence == 1.0
    assert [(e.name, e.type) for e in extract_one(ep).entities] == [
        ("support", "agent"),
        ("researcher", "agent"),
        ("writer", "agent"),
    ]


def test_depends_on_from_consecutive_successful_calls_of_a_successful_episode() -> None:
    calls = [
        ok("get_user"),
        ok("get_reservation"),
        ok("get_reservation"),
        failed("update", "Error: x"),
        ok("update"),
        ok("get_user"),
        ok("get_reservation"),
        CallSeen(tool="notify"),
    ]
    assert triples(episode(calls), "depends_on") == [
        ("get_reservation", "depends_on", "get_user", 2),
        ("get_user", "depends_on", "update", 1),
    ]
    assert {f.confidence for f in extract_one(episode(calls)).facts if f.predicate == "depends_on"} == {0.65}
    assert triples(episode(calls, outcome=Outcome.FAILURE), "depends_on") == []
    assert triples(episode(calls, outcome=Outcome.PARTIAL), "depends_on") == []


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ({"project": "crm-sync"}, [("works_on", "crm-sync", "project")]),
        ({"Project_Name": " Apollo  2 "}, [("works_on", "Apollo 2", "project")]),
        (
            {"client": "Acme", "customer": "Acme", "account": 4711},
            [("serves", "Acme", "client"), ("serves", "4711", "client")],
        ),
        ({"customer_name": ["Acme", "Globex", ""]}, [("serves", "Acme", "client"), ("serves", "Globex", "client")]),
        ({"project": None, "client": True, "account": {"id": 1}, "task_id": 3}, []),
    ],
)
def test_projects_and_clients_from_metadata(metadata: dict[str, Any], expected: list[tuple[str, str, str]]) -> None:
    out = extract_one(episode([], metadata=metadata))
    assert [(f.predicate, f.target, f.target_type) for f in out.facts] == expected
    assert {(f.source, f.confidence) for f in out.facts} <= {("support", 0.9)}


def test_metadata_keys_are_a_small_documented_set() -> None:
    assert PROJECT_KEYS == ("project", "project_name")
    assert CLIENT_KEYS == ("client", "client_name", "customer", "customer_name", "account", "account_name")


def test_an_episode_from_before_calls_uses_its_tools_and_errors() -> None:
    ep = episode(
        [],
        tools=["a", "b"],
        errors=[ErrorSeen(tool="a", error="HTTP 429: Too Many Requests", http_status=429, resolved=True)],
    )
    assert triples(ep) == [
        ("support", "uses", "a", 1),
        ("support", "uses", "b", 1),
        ("a", "failed_with", "HTTP 429: Too Many Requests", 1),
    ]
    [err] = [e for e in extract_one(ep).entities if e.type == "error"]
    assert err.attributes == {"example": "HTTP 429: Too Many Requests", "http_status": 429}


# ---- bounds and determinism --------------------------------------------------------------------


def test_facts_are_capped_per_episode_dropping_inferences_first() -> None:
    calls = [ok(f"tool_{i}", hosts=[f"h{i}.io"]) for i in range(150)]
    out = extract_one(episode(calls))
    assert len(out.facts) == MAX_FACTS
    assert [f.predicate for f in out.facts] == ["uses"] * 150 + ["calls"] * 50
    assert out == extract_one(episode(calls))
    ends = {(f.source, f.source_type) for f in out.facts} | {(f.target, f.target_type) for f in out.facts}
    assert {(e.name, e.type) for e in out.entities} == ends
    assert len(TraceExtractor(max_facts=3).extract([episode(calls)])[0].facts) == 3


def test_long_names_are_cut() -> None:
    out = extract_one(episode([ok("t" * 500)], metadata={"project": "p" * 500}))
    assert {len(f.target) for f in out.facts} == {extraction.MAX_NAME}


call_st = st.builds(
    CallSeen,
    tool=st.sampled_from(["a", "b", "c", " ", "x" * 300]),
    ok=st.sampled_from([True, False, None]),
    error=st.one_of(
        st.none(),
        st.text(max_size=80),
        st.sampled_from(["HTTP 429: limit of 10 requests per second", "Error: flight HAT030 not available"]),
    ),
    http_status=st.sampled_from([None, 429, 500]),
    hosts=st.lists(st.sampled_from(["a.io", "b.io"]), max_size=2),
    rate_headers=st.dictionaries(
        st.sampled_from(["x-ratelimit-limit", "x-ratelimit-window", "retry-after"]),
        st.sampled_from(["1", "10", "60s", "0", "soon"]),
        max_size=3,
    ),
)
episode_st = st.builds(
    lambda calls, outcome, to, meta: episode(
        calls, outcome=outcome, delegations=[Delegation(to_agent=t, task="") for t in to], metadata=meta
    ),
    st.lists(call_st, max_size=30),
    st.sampled_from(list(Outcome)),
    st.lists(st.sampled_from(["r", "w"]), max_size=3),
    st.dictionaries(
        st.sampled_from(["project", "client", "account", "other"]),
        st.one_of(st.text(max_size=10), st.integers(), st.none()),
        max_size=3,
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(episode_st, max_size=4))
def test_extraction_is_deterministic_and_valid(eps: list[EpisodeDistilled]) -> None:
    first = encode(TraceExtractor().extract(eps))
    assert encode(TraceExtractor().extract(eps)) == first
    decoded = msgspec.json.decode(first, type=list[FactsExtracted])  # validates names, counts, confidences
    assert len(decoded) == len(eps)
    for out in decoded:
        keys = [(f.source, f.predicate, f.target) for f in out.facts]
        assert len(keys) == len(set(keys)) and len(keys) <= MAX_FACTS
        nodes = [(e.name, e.type) for e in out.entities]
        assert len(nodes) == len(set(nodes))
        limited = [(f.source, f.source_type) for f in out.facts if f.predicate == "rate_limit"]
        assert len(limited) == len(set(limited))  # functional: one value per source and episode


def test_the_input_episodes_are_not_modified() -> None:
    ep = rich_episode()
    before = encode(ep)
    TraceExtractor().extract([ep, ep])
    assert encode(ep) == before


# ---- real data: tau-bench ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tau_facts() -> tuple[Path, list[EpisodeDistilled], list[FactsExtracted]]:
    path = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"
    if not path.exists():
        pytest.skip(f"dataset missing: {path}")
    decoded = [decode_trace(orjson.dumps(e), max_bytes=1_048_576) for e in openai_chat(path, agent="airline")]
    assert not any(isinstance(d, Rejection) for d in decoded)
    episodes = distill({}, decoded).episodes  # type: ignore[arg-type]
    return path, episodes, TraceExtractor().extract(episodes)


def test_tau_bench_error_facts_match_the_raw_file(tau_facts) -> None:
    path, episodes, out = tau_facts
    raw_errors, raw_calls, _ = raw_tau_counts(path)
    assert sum(raw_errors.values()) == 73
    classes: dict[tuple[str, str], set[str]] = {}
    got: Counter[tuple[str, str]] = Counter()
    for facts in out:
        examples = {e.name: e.attributes["example"] for e in facts.entities if e.type == "error"}
        for f in facts.facts:
            if f.predicate == "failed_with":
                key = (f.source, tau_group(examples[f.target]))
                got[key] += f.count
                classes.setdefault(key, set()).add(f.target)
    assert got == raw_errors
    # one error class per kind of error, over all 200 episodes
    assert all(len(v) == 1 for v in classes.values()), classes
    by_class = {(tool, next(iter(c))): got[(tool, g)] for (tool, g), c in classes.items()}
    assert by_class == {
        ("update_reservation_flights", "flight <id> not available on date <date>"): 15,
        ("update_reservation_flights", "gift card balance is not enough"): 11,
        ("update_reservation_flights", "not enough seats on flight <id>"): 8,
        ("update_reservation_flights", "certificate cannot be used to update reservation"): 4,
        ("update_reservation_flights", "payment method not found"): 4,
        ("update_reservation_baggages", "gift card balance is not enough"): 1,
        ("book_reservation", "payment amount does not add up, total price is <n>, but paid <n>"): 24,
        ("book_reservation", "payment method <id> not found"): 3,
        ("book_reservation", "not enough balance in payment method <id>"): 2,
        ("book_reservation", "not enough seats on flight <id>"): 1,
    }
    # the same error of two tools is one entity: 10 (tool, error) pairs, 8 errors
    assert len({c for _, c in by_class}) == 8


def test_tau_bench_uses_facts_count_every_call(tau_facts) -> None:
    path, episodes, out = tau_facts
    _, raw_calls, _ = raw_tau_counts(path)
    got: Counter[str] = Counter()
    for facts in out:
        for f in facts.facts:
            if f.predicate == "uses":
                assert (f.source, f.source_type, f.target_type) == ("airline", "agent", "tool")
                got[f.target] += f.count
    assert got == raw_calls and sum(got.values()) == 1164


def test_tau_bench_entities_are_unique_and_inferences_come_from_successes(tau_facts) -> None:
    _, episodes, out = tau_facts
    assert len(out) == len(episodes) == 200
    for ep, facts in zip(episodes, out):
        assert facts.episode_id == ep.episode_id
        nodes = [(e.name, e.type) for e in facts.entities]
        assert len(nodes) == len(set(nodes))
        tools = [e.name for e in facts.entities if e.type == "tool"]
        assert len(tools) == len(set(tools)) == len(set(ep.tools))
        if ep.outcome is not Outcome.SUCCESS:
            assert not any(f.predicate == "depends_on" for f in facts.facts)
    assert any(f.predicate == "depends_on" for facts in out for f in facts.facts)
    assert encode(TraceExtractor().extract(episodes)) == encode(out)
