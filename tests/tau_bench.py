"""tau-bench counted straight from the raw file, independently of the importer and the extractor."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

# One regex per kind of tool error in the file (not the extractor's error_class).
TAU_GROUPS = {
    "flight not available": r"^Error: flight \w+ not available on date [\d-]+$",
    "payment amount": r"^Error: payment amount does not add up, total price is \d+, but paid \d+$",
    "gift card balance": r"^Error: gift card balance is not enough$",
    "not enough seats": r"^Error: not enough seats on flight \w+$",
    "certificate": r"^Error: certificate cannot be used to update reservation$",
    "payment method not found": r"^Error: payment method not found$",
    "named payment method not found": r"^Error: payment method \w+ not found$",
    "not enough balance": r"^Error: not enough balance in payment method \w+$",
}


def tau_group(text: str) -> str:
    found = [g for g, rx in TAU_GROUPS.items() if re.match(rx, text)]
    assert len(found) == 1, (text, found)
    return found[0]


def raw_tau_counts(path: Path) -> tuple[Counter[tuple[str, str]], Counter[str], dict[tuple[str, str], str]]:
    """(tool, group) -> failed calls, tool -> calls, and one raw example per (tool, group)."""
    errors: Counter[tuple[str, str]] = Counter()
    calls: Counter[str] = Counter()
    examples: dict[tuple[str, str], str] = {}
    for traj in json.loads(path.read_bytes()):
        names: dict[str, str] = {}
        for m in traj["traj"]:
            for tc in m.get("tool_calls") or []:
                names[tc["id"]] = tc["function"]["name"]
                calls[tc["function"]["name"]] += 1
            if m["role"] == "tool" and (m.get("content") or "").startswith("Error"):
                key = (m.get("name") or names[m["tool_call_id"]], tau_group(m["content"].strip()))
                errors[key] += 1
                examples.setdefault(key, m["content"].strip())
    return errors, calls, examples
