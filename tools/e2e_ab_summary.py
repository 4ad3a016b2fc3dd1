"""Summarise tools/e2e_ab.sh output: every run, then each tree's medians (events/s, CPU µs per event).

Usage: python3 tools/e2e_ab_summary.py OUT
"""

import collections
import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1])]
by_tree = collections.defaultdict(list)
for r in runs:
    by_tree[r["tree"]].append(r)
    print(r["tree"], r["round"], r["start"], r["load"], r["eps"], r["cpu"])
for tree, rs in by_tree.items():
    cpu = {k: statistics.median(r["cpu"][k] for r in rs) for k in rs[0]["cpu"]}
    print(tree, "median events/s", statistics.median(r["eps"] for r in rs), "median µs/event", cpu)
