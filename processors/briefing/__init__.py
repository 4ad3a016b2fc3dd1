"""What an agent is shown: the briefing generator, the query planner and the one sanitiser."""
