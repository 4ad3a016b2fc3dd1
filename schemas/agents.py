"""Agents are declared in a folder of Markdown files with YAML front matter, as runtimes do today.

Front matter: ``name``, ``reportsTo`` (another agent's name or null) and memory settings.
Teams are derived from ``reportsTo``: a lead and everyone who reports to it, directly or not.
Invalid values get an ``AgentFileError`` naming the file and the field.
"""

from __future__ import annotations

from enum import Enum
from importlib.resources import files
from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from somnus.schemas.facts import GLOBAL_SCOPE, agent_scope, team_scope

# The sample fleet ships as package data of ``somnus`` (pyproject's package-data).
DEFAULT_DIR = Path(str(files("somnus").joinpath("data", "agents")))


DEFAULT_MAX_EPISODES = 50  # maxEpisodes when an agent file does not set it


class LearningRate(str, Enum):
    CONSERVATIVE = "conservative"
    MODERATE = "moderate"
    AGGRESSIVE = "aggressive"


class AgentSpec(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=False):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    reports_to: str | None = None
    episodic: bool = True
    max_episodes: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_MAX_EPISODES
    briefing_enabled: bool = True
    briefing_token_budget: Annotated[int, msgspec.Meta(ge=0)] = 2000
    learning_rate: LearningRate = LearningRate.MODERATE
    # other teams to read: "x" or "team:x" (no spaces; an empty name would be a scope nobody writes)
    knowledge_scopes: list[Annotated[str, msgspec.Meta(pattern=r"^(team:)?[^\s:]+$")]] = []


class AgentFileError(ValueError):
    """An agent file is missing front matter or has an invalid field."""


def parse_agent_file(path: Path) -> AgentSpec:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise AgentFileError(f"{path}: no YAML front matter (the file must start with a '---' line)")
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise AgentFileError(f"{path}: front matter is not closed by a '---' line") from None
    try:
        data = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise AgentFileError(f"{path}: front matter is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise AgentFileError(f"{path}: front matter must be a mapping of fields")
    try:
        return msgspec.convert(data, AgentSpec)
    except msgspec.ValidationError as exc:
        raise AgentFileError(f"{path}: {exc}") from None


def load_agents(folder: Path | None = None) -> dict[str, AgentSpec]:
    folder = folder or DEFAULT_DIR
    agents: dict[str, AgentSpec] = {}
    files: dict[str, Path] = {}
    for path in sorted(folder.glob("*.md")):
        spec = parse_agent_file(path)
        if spec.name in agents:
            raise AgentFileError(f"{path}: field `name`: agent {spec.name!r} is declared twice")
        agents[spec.name] = spec
        files[spec.name] = path
    for spec in agents.values():
        if spec.reports_to is not None and spec.reports_to not in agents:
            raise AgentFileError(f"{files[spec.name]}: field `reportsTo`: unknown agent {spec.reports_to!r}")
    return agents


def team_lead(agents: dict[str, AgentSpec], name: str) -> str:
    """The top of ``name``'s reporting chain (its team is named after it); cycles are an error."""
    seen = [name]
    while agents[seen[-1]].reports_to is not None:
        nxt = agents[seen[-1]].reports_to
        assert nxt is not None
        if nxt in seen:
            raise AgentFileError(f"field `reportsTo`: reporting cycle {' -> '.join(seen + [nxt])}")
        seen.append(nxt)
    return seen[-1]


def teams(agents: dict[str, AgentSpec]) -> dict[str, list[str]]:
    """Team name (its lead) -> members, lead first."""
    out: dict[str, list[str]] = {}
    for name in agents:
        out.setdefault(team_lead(agents, name), []).append(name)
    for lead, members in out.items():
        members.sort(key=lambda m: (m != lead, m))
    return out


def scope_chain(agents: dict[str, AgentSpec], name: str) -> list[str]:
    """The scopes an agent reads, narrowest first: its own, its team, extra ``knowledgeScopes``, global.

    A team is the agents sharing one ``reportsTo`` (scope ``team:<reportsTo>``); an agent without
    ``reportsTo`` has no team (issue 3), so a lead reads its reports' team scope only if it names it
    in ``knowledgeScopes``. ``knowledgeScopes`` names other teams (``team:x`` or just ``x``).
    An agent that is not declared reads its own scope and global only.

    >>> agents = {"lead": AgentSpec(name="lead"), "a": AgentSpec(name="a", reports_to="lead",
    ...           knowledge_scopes=["ops"])}
    >>> scope_chain(agents, "a")
    ['agent:a', 'team:lead', 'team:ops', 'global']
    >>> scope_chain(agents, "lead"), scope_chain(agents, "stranger")
    (['agent:lead', 'global'], ['agent:stranger', 'global'])
    """
    chain = [agent_scope(name)]
    spec = agents.get(name)
    if spec is not None:
        if spec.reports_to is not None:
            chain.append(team_scope(spec.reports_to))
        for extra in spec.knowledge_scopes:
            scope = extra if extra.startswith("team:") else team_scope(extra)
            if scope not in chain:
                chain.append(scope)
    chain.append(GLOBAL_SCOPE)
    return chain
