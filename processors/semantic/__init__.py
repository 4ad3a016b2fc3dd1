"""Semantic memory (the ATL): concepts, the three memory layers and promotion."""
