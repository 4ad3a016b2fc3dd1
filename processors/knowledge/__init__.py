"""Knowledge: entity extraction, the temporal triple log and swarm knowledge metrics."""
