"""Results files (``--results``): outcomes by id, from a SWE-bench report or a plain JSON map."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from somnus.importers.common import ImportShapeError

RESOLVED_KEYS = ("resolved", "resolved_ids")
# Lists of ids a SWE-bench report holds that were evaluated (or failed to be) and are not resolved
# unless also listed as resolved.
UNRESOLVED_KEYS = (
    "unresolved",
    "unresolved_ids",
    "error_ids",
    "empty_patch_ids",
    "completed_ids",
    "submitted_ids",
    "no_generation",
    "generated",
    "with_logs",
    "install_fail",
    "reset_failed",
    "no_apply",
    "applied",
    "test_errored",
    "test_timeout",
)
IGNORED_KEYS = (
    "incomplete_ids",
    "schema_version",
    "total_instances",
    "submitted_instances",
    "completed_instances",
    "resolved_instances",
    "unresolved_instances",
    "empty_patch_instances",
    "error_instances",
)


def load_results(path: Path) -> dict[str, str]:
    """Outcomes by instance id from a results file: a SWE-bench style report (``resolved`` /
    ``resolved_ids`` lists are successes; ids in its other lists (``unresolved``, ``error_ids``,
    ``empty_patch_ids``, ``completed_ids``...) are failures unless also resolved), or a JSON map
    id -> outcome (``success`` | ``failure`` | ``partial``, ``resolved`` | ``unresolved``, true | false,
    or an object with a boolean ``resolved``, as SWE-bench's per-instance report has)."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ImportShapeError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ImportShapeError(
            f"{path}: expected an object (a SWE-bench report or a map id -> outcome), got {type(data).__name__}"
        )
    if any(k in data for k in RESOLVED_KEYS + UNRESOLVED_KEYS):
        return _report_outcomes(path, data)
    return {str(k): _one_outcome(path, str(k), v) for k, v in data.items()}


def _report_outcomes(path: Path, data: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        if key in IGNORED_KEYS:
            continue
        if key not in RESOLVED_KEYS + UNRESOLVED_KEYS:
            raise ImportShapeError(
                f"{path}: field '{key}' is not a list a SWE-bench report has "
                f"(known: {', '.join(RESOLVED_KEYS + UNRESOLVED_KEYS)})"
            )
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ImportShapeError(f"{path}: field '{key}' must be a list of instance ids")
    for key in UNRESOLVED_KEYS:
        for ident in data.get(key) or []:
            out[ident] = "failure"
    for key in RESOLVED_KEYS:
        for ident in data.get(key) or []:
            out[ident] = "success"
    return out


_RESULT_WORDS = {
    "success": "success",
    "failure": "failure",
    "partial": "partial",
    "resolved": "success",
    "unresolved": "failure",
}


def _one_outcome(path: Path, ident: str, value: Any) -> str:
    if isinstance(value, bool):
        return "success" if value else "failure"
    if isinstance(value, str) and value in _RESULT_WORDS:
        return _RESULT_WORDS[value]
    if isinstance(value, dict) and isinstance(value.get("resolved"), bool):
        return "success" if value["resolved"] else "failure"
    raise ImportShapeError(
        f"{path}: field '{ident}': expected success|failure|partial, resolved|unresolved, "
        f"true|false or an object with a boolean 'resolved', got {value!r}"
    )
