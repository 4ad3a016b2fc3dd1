"""somnus.processors.prediction.advise: the four bridges over tiny hand-made pasts (pure, no store)."""

from __future__ import annotations

import pytest

from somnus.processors.prediction.advise import (
    AdviceConfig,
    AdviceInputs,
    PastEpisode,
    ToolRisk,
    advise,
    similarity,
    words_of,
)


def ep(
    i: int,
    task: str,
    success: bool | None,
    tools: list[str],
    failed: list[str] = (),
    entities: list[str] = (),
    memories: list[str] = (),
) -> PastEpisode:
    return PastEpisode(
        episode_id=f"e{i:02d}",
        session_id=f"s{i}",
        task=task,
        success=success,
        tools=list(tools),
        failed_tools=list(failed),
        entities=list(entities),
        memory_ids=list(memories),
    )


REFUND = "refund the duplicate charge on invoice"
SHIP = "ship the replacement order to the customer"
PAY = ToolRisk(
    tool="issue_refund",
    calls=20,
    errors=14,
    outcomes={"ok": 0.3, "error:card declined": 0.55, "http:429": 0.15},
    negative={"error:card declined"},
)
LOOKUP = ToolRisk(tool="lookup_invoice", calls=40, errors=0, outcomes={"ok": 1.0}, negative=set())


def test_words_and_similarity():
    assert words_of("Please REFUND the charge!") == {"refund", "charge"}
    assert similarity(words_of(REFUND), words_of(REFUND)) == 1.0
    assert similarity(words_of(REFUND), words_of(SHIP)) == 0.0
    assert similarity(frozenset(), words_of(SHIP)) == 0.0


def test_a_planted_high_failure_context_escalates_and_a_healthy_one_does_not():
    failing = [
        ep(i, REFUND, False, ["lookup_invoice", "issue_refund"], ["issue_refund"], memories=[f"m{i}"]) for i in range(4)
    ] + [ep(4, REFUND, True, ["lookup_invoice", "issue_refund"])]
    healthy = [ep(10 + i, SHIP, True, ["create_shipment"]) for i in range(5)]
    healthy.append(ep(20, SHIP, False, ["create_shipment"]))
    inputs = AdviceInputs(episodes=failing + healthy, tools={"issue_refund": PAY, "lookup_invoice": LOOKUP})
    bad = advise("billing", "Refund a duplicate charge on the invoice", inputs)
    assert bad.escalation.escalate and bad.escalation.failures == 4 and bad.escalation.related == 5
    assert bad.escalation.failure_rate == pytest.approx(0.8)
    assert bad.escalation.episode_ids == ["e00", "e01", "e02", "e03"]  # the failures, as provenance
    assert bad.escalation.memory_ids == ["m0", "m1", "m2", "m3"]
    good = advise("billing", "ship the replacement order", inputs)
    assert not good.escalation.escalate and good.escalation.related == 6
    assert good.escalation.failure_rate == pytest.approx(1 / 6)
    # the bar is the config's, and fewer related episodes than min_support never escalate
    assert not advise("billing", REFUND, inputs, AdviceConfig(escalation_threshold=0.85)).escalation.escalate
    few = advise("billing", REFUND, inputs, AdviceConfig(min_support=6)).escalation
    assert not few.escalate and "fewer than 6" in few.reason


def test_risks_are_the_negative_links_of_tools_used_in_related_episodes():
    inputs = AdviceInputs(
        episodes=[
            ep(0, REFUND, False, ["lookup_invoice", "issue_refund"], ["issue_refund"]),
            ep(1, SHIP, False, ["create_shipment"], ["create_shipment"]),
        ],
        tools={
            "issue_refund": PAY,
            "lookup_invoice": LOOKUP,
            "create_shipment": ToolRisk(
                tool="create_shipment", calls=2, errors=2, outcomes={"error:x": 1.0}, negative={"error:x"}
            ),
        },
    )
    got = advise("billing", REFUND, inputs)
    assert [r.tool for r in got.risks] == ["issue_refund"]  # lookup never fails; create_shipment is not related
    risk = got.risks[0]
    assert risk.strength == pytest.approx(0.55)  # the rate limit is neutral: not counted as a failure
    assert risk.error_classes == [("error:card declined", 0.55)]
    assert (risk.calls, risk.errors, risk.observed_rate, risk.failed_in, risk.episode_ids) == (20, 14, 0.7, 1, ["e00"])
    assert advise("billing", REFUND, inputs, AdviceConfig(min_risk=0.6)).risks == []


def test_planning_ranks_strategies_that_succeeded_for_this_and_related_tasks():
    inputs = AdviceInputs(
        episodes=[
            ep(0, REFUND, True, ["lookup_invoice", "issue_refund"], memories=["m0"]),
            ep(1, REFUND, True, ["lookup_invoice", "issue_refund"]),
            ep(2, REFUND, False, ["lookup_invoice", "issue_refund"]),
            ep(3, "refund a charge", True, ["issue_refund"]),  # related, less similar
            ep(4, REFUND, False, ["escalate_ticket"]),  # never succeeded: not a strategy
            ep(5, SHIP, True, ["create_shipment"]),
        ],
        tools={},
    )  # unrelated
    got = advise("billing", REFUND, inputs).planning
    assert [s.tools for s in got] == [["lookup_invoice", "issue_refund"], ["issue_refund"]]
    first = got[0]
    assert (first.successes, first.attempts, first.success_rate, first.score) == (2, 3, pytest.approx(2 / 3), 2.0)
    assert first.episode_ids == ["e00", "e01"] and first.memory_ids == ["m0"]
    assert got[1].best_similarity == pytest.approx(similarity(words_of(REFUND), words_of("refund a charge")))


def test_salience_names_entities_that_go_with_success_in_related_episodes():
    inputs = AdviceInputs(
        episodes=[
            ep(0, REFUND, True, ["issue_refund"], entities=["agent:billing", "tool:issue_refund", "customer:acme"]),
            ep(1, REFUND, True, ["issue_refund"], entities=["agent:billing", "customer:acme"]),
            ep(2, REFUND, False, ["issue_refund"], entities=["agent:billing", "customer:globex", "tool:issue_refund"]),
            ep(3, SHIP, True, ["create_shipment"], entities=["carrier:ups"]),
        ],
        tools={},
    )
    got = advise("billing", REFUND, inputs).salience
    # the asking agent's own entity is never salient, even where it goes with success
    lifted = AdviceInputs(episodes=[*inputs.episodes, ep(5, REFUND, False, ["issue_refund"])], tools={})
    assert "agent:billing" in {s.entity for s in advise("other", REFUND, lifted).salience}
    assert "agent:billing" not in {s.entity for s in advise("billing", REFUND, lifted).salience}
    # agent:billing is in every related episode (no lift); tool:issue_refund succeeded half the time,
    # below the related rate 2/3; globex only failed; ups is not related
    assert [(s.entity, s.successes, s.seen_in, s.episode_ids) for s in got] == [("customer:acme", 2, 2, ["e00", "e01"])]
    assert got[0].success_rate == 1.0 and got[0].lift == pytest.approx(1 / 3)
    assert got[0].score == pytest.approx(2 / 3)


def test_no_related_past_gives_empty_advice_and_a_blank_task_is_an_error():
    got = advise("billing", "translate a poem", AdviceInputs(episodes=[ep(0, REFUND, False, ["x"])], tools={}))
    assert (got.related, got.planning, got.risks, got.salience, got.escalation.escalate) == (0, [], [], [], False)
    with pytest.raises(ValueError, match="task is required"):
        advise("billing", "  ", AdviceInputs(episodes=[], tools={}))


def test_the_advice_is_the_same_whatever_the_order_of_the_past():
    past = [
        ep(
            i,
            REFUND if i % 2 else "refund charge",
            i % 3 == 0,
            ["lookup_invoice", "issue_refund"][: 1 + i % 2],
            ["issue_refund"] if i % 3 else [],
            [f"c:{i % 4}"],
        )
        for i in range(12)
    ]
    tools = {"issue_refund": PAY, "lookup_invoice": LOOKUP}
    assert advise("b", REFUND, AdviceInputs(episodes=past, tools=tools)) == advise(
        "b", REFUND, AdviceInputs(episodes=past[::-1], tools=tools)
    )
