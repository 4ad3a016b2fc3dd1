"""somnus.schemas.agents: agents declared in Markdown front matter; teams derived from reportsTo."""

from __future__ import annotations

from pathlib import Path

import pytest

from somnus.sample import TEAMS as SAMPLE_TEAMS
from somnus.schemas.agents import (
    DEFAULT_DIR,
    AgentFileError,
    AgentSpec,
    LearningRate,
    load_agents,
    parse_agent_file,
    team_lead,
    teams,
)


def agent_file(folder: Path, filename: str, front: str, body: str = "# notes\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(f"---\n{front.strip()}\n---\n{body}", encoding="utf-8")
    return path


def test_the_built_in_fleet_loads_with_its_defaults():
    agents = load_agents()
    assert sorted(agents) == ["deployer", "ops-lead", "research-lead", "researcher", "scraper", "support"]
    assert load_agents(DEFAULT_DIR) == agents
    for spec in agents.values():
        assert (
            spec.episodic,
            spec.max_episodes,
            spec.briefing_enabled,
            spec.briefing_token_budget,
            spec.learning_rate,
            spec.knowledge_scopes,
        ) == (True, 50, True, 2000, LearningRate.MODERATE, [])
    assert {n: s.reports_to for n, s in agents.items()} == {
        "research-lead": None,
        "researcher": "research-lead",
        "scraper": "research-lead",
        "ops-lead": None,
        "deployer": "ops-lead",
        "support": "ops-lead",
    }


def test_teams_of_the_built_in_fleet():
    assert teams(load_agents()) == {
        "research-lead": ["research-lead", "researcher", "scraper"],
        "ops-lead": ["ops-lead", "deployer", "support"],
    }


def test_the_built_in_fleet_is_the_one_the_sample_generator_uses():
    got = {lead: members[1:] for lead, members in teams(load_agents()).items()}
    assert got == {lead: sorted(members) for lead, members in SAMPLE_TEAMS.items()}


def test_defaults_of_an_agent_spec():
    spec = AgentSpec(name="x")
    assert (
        spec.reports_to,
        spec.episodic,
        spec.max_episodes,
        spec.briefing_enabled,
        spec.briefing_token_budget,
        spec.learning_rate,
        spec.knowledge_scopes,
    ) == (None, True, 50, True, 2000, LearningRate.MODERATE, [])


def test_camel_case_fields_are_read(tmp_path):
    path = agent_file(
        tmp_path,
        "a.md",
        """
name: analyst
reportsTo: null
episodic: false
maxEpisodes: 0
briefingEnabled: false
briefingTokenBudget: 512
learningRate: aggressive
knowledgeScopes: [pricing, vendors]
unknownField: ignored
""",
    )
    spec = parse_agent_file(path)
    assert spec == AgentSpec(
        name="analyst",
        episodic=False,
        max_episodes=0,
        briefing_enabled=False,
        briefing_token_budget=512,
        learning_rate=LearningRate.AGGRESSIVE,
        knowledge_scopes=["pricing", "vendors"],
    )


def test_teams_include_indirect_reports_lead_first_then_by_name(tmp_path):
    agent_file(tmp_path, "ceo.md", "name: ceo")
    agent_file(tmp_path, "vp.md", "name: vp\nreportsTo: ceo")
    agent_file(tmp_path, "alice.md", "name: alice\nreportsTo: vp")
    agent_file(tmp_path, "zed.md", "name: zed\nreportsTo: ceo")
    agent_file(tmp_path, "solo.md", "name: solo")
    agents = load_agents(tmp_path)
    assert teams(agents) == {"ceo": ["ceo", "alice", "vp", "zed"], "solo": ["solo"]}
    assert team_lead(agents, "alice") == "ceo"


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("maxEpisodes: -1", "maxEpisodes"),
        ("maxEpisodes: many", "maxEpisodes"),
        ("learningRate: fast", "learningRate"),
        ("briefingEnabled: maybe", "briefingEnabled"),
        ("briefingTokenBudget: -10", "briefingTokenBudget"),
        ("episodic: 3", "episodic"),
        ("knowledgeScopes: pricing", "knowledgeScopes"),
        ("reportsTo: [a, b]", "reportsTo"),
    ],
)
def test_an_invalid_field_names_the_file_and_the_field(tmp_path, line, field):
    path = agent_file(tmp_path, "broken.md", f"name: broken\n{line}")
    with pytest.raises(AgentFileError) as info:
        load_agents(tmp_path)
    message = str(info.value)
    assert str(path) in message
    assert f"$.{field}" in message, message


@pytest.mark.parametrize("front", ["reportsTo: null", 'name: ""'], ids=["no name", "empty name"])
def test_an_agent_needs_a_name(tmp_path, front):
    path = agent_file(tmp_path, "anon.md", front)
    with pytest.raises(AgentFileError, match="name") as info:
        parse_agent_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text",
    ["# just notes\nname: x\n", "", "\n---\nname: x\n---\n"],
    ids=["no front matter", "empty file", "front matter not first"],
)
def test_missing_front_matter(tmp_path, text):
    path = tmp_path / "plain.md"
    path.write_text(text)
    with pytest.raises(AgentFileError, match="no YAML front matter") as info:
        parse_agent_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("---\nname: x\n", "not closed"),
        ("---\nname: [x\n---\n", "not valid YAML"),
        ("---\n- a\n- b\n---\n", "must be a mapping"),
    ],
)
def test_broken_front_matter(tmp_path, text, match):
    path = tmp_path / "bad.md"
    path.write_text(text)
    with pytest.raises(AgentFileError, match=match) as info:
        parse_agent_file(path)
    assert str(path) in str(info.value)


def test_an_unknown_reports_to_is_an_error(tmp_path):
    agent_file(tmp_path, "bob.md", "name: bob\nreportsTo: ghost")
    with pytest.raises(AgentFileError, match="field `reportsTo`: unknown agent 'ghost'") as info:
        load_agents(tmp_path)
    assert "bob.md" in str(info.value)


def test_an_unknown_reports_to_names_the_file_that_declares_it(tmp_path):
    path = agent_file(tmp_path, "alpha.md", "name: bob\nreportsTo: ghost")
    with pytest.raises(AgentFileError) as info:
        load_agents(tmp_path)
    assert str(path) in str(info.value)


def test_a_name_declared_twice_is_an_error(tmp_path):
    agent_file(tmp_path, "a.md", "name: twin")
    second = agent_file(tmp_path, "b.md", "name: twin")
    with pytest.raises(AgentFileError, match="declared twice") as info:
        load_agents(tmp_path)
    assert str(second) in str(info.value) and "`name`" in str(info.value)


def test_a_reporting_cycle_is_an_error(tmp_path):
    agent_file(tmp_path, "a.md", "name: a\nreportsTo: b")
    agent_file(tmp_path, "b.md", "name: b\nreportsTo: c")
    agent_file(tmp_path, "c.md", "name: c\nreportsTo: a")
    agents = load_agents(tmp_path)
    with pytest.raises(AgentFileError, match=r"field `reportsTo`: reporting cycle a -> b -> c -> a"):
        teams(agents)


def test_an_agent_reporting_to_itself_is_a_cycle(tmp_path):
    agent_file(tmp_path, "a.md", "name: a\nreportsTo: a")
    with pytest.raises(AgentFileError, match="reporting cycle a -> a"):
        teams(load_agents(tmp_path))


def test_only_markdown_files_are_agents(tmp_path):
    agent_file(tmp_path, "a.md", "name: a")
    (tmp_path / "notes.txt").write_text("name: not-an-agent")
    assert list(load_agents(tmp_path)) == ["a"]


def test_an_empty_folder_has_no_agents_and_no_teams(tmp_path):
    assert load_agents(tmp_path) == {}
    assert teams({}) == {}


def test_a_value_containing_three_dashes_is_read(tmp_path):
    path = agent_file(tmp_path, "a.md", 'name: a\nknowledgeScopes: ["runbooks---2024"]')
    assert parse_agent_file(path).knowledge_scopes == ["runbooks---2024"]


def test_the_body_may_contain_horizontal_rules(tmp_path):
    path = agent_file(tmp_path, "a.md", "name: a", body="# a\n\n---\n\nmore notes\n---\n")
    assert parse_agent_file(path).name == "a"


# Every field, more kinds of invalid value: wrong type, null where a value is needed, out of range.
@pytest.mark.parametrize(
    ("front", "field", "why"),
    [
        ("name: [x]", "name", "Expected `str`"),
        ("name: a\nreportsTo: 5", "reportsTo", "Expected `str | null`"),
        ("name: a\nepisodic: maybe", "episodic", "Expected `bool`"),
        ("name: a\nepisodic: null", "episodic", "Expected `bool`"),
        ("name: a\nmaxEpisodes: 2.5", "maxEpisodes", "Expected `int`"),
        ("name: a\nmaxEpisodes: null", "maxEpisodes", "Expected `int`"),
        ("name: a\nmaxEpisodes: true", "maxEpisodes", "Expected `int`"),
        ("name: a\nbriefingEnabled: 1", "briefingEnabled", "Expected `bool`"),
        ("name: a\nbriefingEnabled: null", "briefingEnabled", "Expected `bool`"),
        ("name: a\nbriefingTokenBudget: lots", "briefingTokenBudget", "Expected `int`"),
        ("name: a\nbriefingTokenBudget: 12.5", "briefingTokenBudget", "Expected `int`"),
        ("name: a\nbriefingTokenBudget: true", "briefingTokenBudget", "Expected `int`"),
        ("name: a\nbriefingTokenBudget: -1", "briefingTokenBudget", ">= 0"),
        ("name: a\nlearningRate: 3", "learningRate", "Expected `str`"),
        ("name: a\nlearningRate: Moderate", "learningRate", "Invalid enum value 'Moderate'"),
        ("name: a\nlearningRate: null", "learningRate", "Expected `str`"),
        ("name: a\nknowledgeScopes: [1, 2]", "knowledgeScopes", "Expected `str`"),
        ("name: a\nknowledgeScopes: {a: b}", "knowledgeScopes", "Expected `array`"),
        ("name: a\nknowledgeScopes: null", "knowledgeScopes", "Expected `array`"),
        ('name: a\nknowledgeScopes: [""]', "knowledgeScopes[0]", "matching regex"),
        ('name: a\nknowledgeScopes: [ops, "team:"]', "knowledgeScopes[1]", "matching regex"),
        ('name: a\nknowledgeScopes: ["data team"]', "knowledgeScopes[0]", "matching regex"),
    ],
)
def test_every_field_rejects_values_of_the_wrong_kind(tmp_path, front, field, why):
    path = agent_file(tmp_path, "bad.md", front)
    with pytest.raises(AgentFileError) as info:
        load_agents(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and f"$.{field}" in message and why in message, message


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("maxEpisodes: 0", 0),
        ("briefingTokenBudget: 0", 0),
        ("learningRate: conservative", LearningRate.CONSERVATIVE),
        ("episodic: yes", True),  # YAML 1.1 booleans, as PyYAML reads them
    ],
)
def test_edge_values_are_accepted(tmp_path, line, value):
    spec = parse_agent_file(agent_file(tmp_path, "ok.md", f"name: ok\n{line}"))
    field = {
        "maxEpisodes": "max_episodes",
        "briefingTokenBudget": "briefing_token_budget",
        "learningRate": "learning_rate",
        "episodic": "episodic",
    }[line.split(":")[0]]
    assert getattr(spec, field) == value
