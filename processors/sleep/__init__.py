"""Deep sleep: consolidation, pruning and dreaming.

``config`` (the policy), ``schedule`` (cron on stream time), ``scoring`` (retention scores and the
consolidation rules), ``plan`` (what a run decides, resume and apply), ``report`` (the run's report),
``encoding`` (the decisions as columnar JSON) and ``dreaming`` (cortex-engine's dream phases, FSRS).
"""
