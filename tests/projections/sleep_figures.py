"""The sleep reports of a whole stream, folded as the projector's memory fold does (the sleep clock
advanced before each record of units, then capture; no broker), summed over the runs: what each
dream phase did. Figures of docs/concepts/sleep.md:

    .venv/bin/python -m tests.projections.sleep_figures sample 300
    .venv/bin/python -m tests.projections.sleep_figures locomo /work/shared/datasets/locomo/locomo5.json
"""

import json
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import orjson

from somnus.processors.episodic.capture import MemoryState, capture
from somnus.processors.episodic.index import IndexConfig
from somnus.processors.sessions.batch import memory_units
from somnus.processors.sessions.distiller import distill
from somnus.processors.sleep.config import SleepConfig
from somnus.projections import schema
from somnus.projections.memory import stemmer
from somnus.projections.sleep import SleepJob
from somnus.schemas.codec import Rejection, decode_trace
from somnus.schemas.lifecycle import SleepTrigger

which = sys.argv[1]
if which == "sample":
    from somnus.sample import generate

    raw = list(generate(sessions=int(sys.argv[2]) if len(sys.argv) > 2 else 300, seed=42))
else:
    from somnus.importers import locomo

    raw = list(locomo(Path(sys.argv[2])))
events = []
for e in raw:
    ev = decode_trace(orjson.dumps(e), max_bytes=1 << 20)
    assert not isinstance(ev, Rejection), ev
    events.append(ev)
state = MemoryState.empty(IndexConfig(stem=stemmer()))
work = tempfile.TemporaryDirectory(prefix="sleep-figures-")
con = duckdb.connect(str(Path(work.name) / "m.duckdb"))
schema.init(con)
job = SleepJob(con, {}, SleepConfig(schedule=sys.argv[3] if len(sys.argv) > 3 else "0 3 * * *"))
prior = {}
t0 = time.perf_counter()
B = 200
for k in range(0, len(events), B):
    batch = events[k : k + B]
    out = distill(prior, batch)
    units = memory_units(prior, batch, out.episodes, frozenset())
    prior.update(out.states)
    if units:
        latest = max(u.occurred_at for u in units)
        for at in job.due(latest):
            job.run(state, at, SleepTrigger.SCHEDULE, k)
        job.observe(units, None)
        capture(state, units, max(u.occurred_at for u in units))
# a final on-demand run an hour after the last unit, as `somnus sleep` does
last = max(state.index.units[i].occurred_at for i in range(len(state.index.ids)))
job.run(state, last + timedelta(hours=1), SleepTrigger.ON_DEMAND, len(events))
runs = job.pending_rows["sleep_runs"]
keys = (
    "memories_before",
    "memories_after",
    "pruned",
    "compressed",
    "clustered",
    "held",
    "created",
    "connected",
    "reviewed",
    "abstracted",
    "triples_retired",
)
tot = {k: 0 for k in keys}
for r in runs:
    rep = json.loads(r["report"])
    for k in keys:
        if k in rep and k not in ("memories_before", "memories_after"):
            tot[k] += rep[k]
last = json.loads(runs[-1]["report"])
print(
    f"{which}: events={len(events)} memories={len(state.index.ids)} runs={len(runs)} "
    f"seconds={time.perf_counter() - t0:.1f}"
)
print("summed over runs:", {k: v for k, v in tot.items() if k not in ("memories_before", "memories_after")})
print("last run:", {k: last.get(k) for k in keys}, "saturation:", last["saturation"])
print("per_layer (last):", last["per_layer"])
con.close()
work.cleanup()
