"""Episodic memory (the hippocampus): memory units, their indexes, recall and the graph."""
