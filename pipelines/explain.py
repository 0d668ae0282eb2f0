"""Plain-language account of rows the consolidate stage did not keep, per domain and source.

A domain below its `min_rows`, or a source whose every row was quarantined, is explained by the
counts the stage already grouped (source, domain, status, reason, an example detail), so the
message names the domain, the source, the reason, the count, an example value and the
quarantine folder, instead of a Great Expectations line about a per-cell table."""

from __future__ import annotations

from collections import defaultdict

from lattice.config import PlatformConfig

HINTS = {
    "bad_timestamp": "check the source's event_time.format (a named format or any Spark datetime pattern, e.g. 'yyyyMMddHH')",
    "timestamp_out_of_range": "check the config's time_range",
    "unknown_domain": "add the value to the source's domain map, or give the map a default",
    "malformed_line": "check the file's format, separator and header",
    "null_key": "an entity key is empty; fix the data or map another column",
    "null_label": "a label is empty; fix the data or the label's column",
    "bad_label": "labels must be 0 or 1; map them with a label 'expr'",
    "bad_value": "a dense value is not a number; fix the data or map it with an expression",
    "bad_split": "the split column holds a value not in training.split.values",
    "duplicate_key": "rows share the source's declared key; check the key columns",
}


def _quarantined(groups: list[dict], **where) -> dict[tuple[str, str], dict]:
    """(source, reason) -> {rows, example} over the quarantined groups matching `where`."""
    out: dict[tuple[str, str], dict] = defaultdict(lambda: {"rows": 0, "example": None})
    for g in groups:
        if g["status"] != "quarantined" or any(g[k] != v for k, v in where.items()):
            continue
        acc = out[(g["source"], g["reason"])]
        acc["rows"] += g["rows"]
        acc["example"] = acc["example"] or g.get("example")
    return out


def _reasons(q: dict[tuple[str, str], dict], with_source: bool) -> str:
    parts = []
    for (src, reason), v in sorted(q.items(), key=lambda kv: -kv[1]["rows"]):
        bits = [f"source {src}"] if with_source else []
        if v["example"]:
            bits.append(f"e.g. {v['example']}")
        parts.append(f"{v['rows']:,} quarantined as {reason}" + (f" ({', '.join(bits)})" if bits else "")
                     + (f": {HINTS[reason]}" if reason in HINTS else ""))
    return "; ".join(parts)


def explain(config: PlatformConfig, groups: list[dict], domains: list[str], quarantine_dir: str) -> list[str]:
    """`groups`: dicts with source, domain, status ('out' / 'quarantined' / 'skipped'), reason,
    rows, example. Returns one line per domain below min_rows and per source that kept nothing."""
    lines: list[str] = []
    min_rows = {d.name: d.min_rows for d in config.domains}
    for d in domains:
        rows_in = sum(g["rows"] for g in groups if g["domain"] == d and g["status"] != "skipped")
        kept = sum(g["rows"] for g in groups if g["domain"] == d and g["status"] == "out")
        if kept >= min_rows[d] and kept > 0:
            continue
        feeding = [s.name for s in config.sources if d in s.domains()]
        if rows_in == 0:
            lines.append(f"domain {d}: 0 rows read (min_rows {min_rows[d]}): no row of its sources {feeding} maps to it in this "
                         "run's window; check each source's 'domain' mapping, its files and the time range")
            continue
        q = _quarantined(groups, domain=d)
        lines.append(f"domain {d}: {kept:,} of {rows_in:,} rows kept (min_rows {min_rows[d]}); {_reasons(q, True)}; "
                     f"see {quarantine_dir}")
    for s in config.sources:
        rows_in = sum(g["rows"] for g in groups if g["source"] == s.name and g["status"] != "skipped")
        kept = sum(g["rows"] for g in groups if g["source"] == s.name and g["status"] == "out")
        if rows_in and not kept:
            lines.append(f"source {s.name}: 0 of {rows_in:,} rows kept; {_reasons(_quarantined(groups, source=s.name), False)}; "
                         f"see {quarantine_dir}")
    return lines
