"""Deep sleep: consolidation, pruning and dreaming."""
