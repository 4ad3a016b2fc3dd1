"""Working memory: one session's buffer and summaries, and user synopses."""
