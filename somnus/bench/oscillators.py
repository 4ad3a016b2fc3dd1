"""``somnus bench oscillators``: the cost of the SCN's coupled oscillators per observed event.

The sample fleet's episodes are observed as the memory projection observes them (patterns
``session_end`` and ``session_end:<outcome>`` of each agent, in end-time order), timing ``observe``
alone: what ``SOMNUS_OSCILLATORS`` adds to the projector's fold per episode."""

from __future__ import annotations

import statistics
import time
from typing import Any


def run_oscillators(sessions: int = 2000, seed: int = 42, repeat: int = 3) -> dict[str, Any]:
    from somnus.bench.advise import sample_episodes
    from somnus.processors.prediction.oscillators import OscillatorConfig, observe

    eps = sorted(sample_episodes(sessions, seed), key=lambda e: (e.ended_at, str(e.episode_id)))
    cfg = OscillatorConfig(enabled=True)
    per_event: list[float] = []
    anomalies = 0
    for _ in range(repeat):
        states: dict[tuple[str, str], Any] = {}
        n = 0
        started = time.perf_counter()
        for i, ep in enumerate(eps):
            for kind in ("session_end", f"session_end:{ep.outcome.value}"):
                key = (ep.agent, kind)
                states[key], reading = observe(states.get(key), ep.ended_at, cfg, source=(0, i, 0))
                n += 1
                anomalies += reading is not None and reading.anomaly is not None and reading.anomaly >= 0.25
        per_event.append((time.perf_counter() - started) / n * 1e6)
    us = statistics.median(per_event)
    return {
        "episodes": len(eps),
        "events": n,
        "patterns": len(states),
        "us_per_event": round(us, 1),
        "us_per_episode": round(2 * us, 1),
        "runs_us_per_event": [round(x, 1) for x in per_event],
        "readings_at_least_0.25": anomalies // repeat,
    }
