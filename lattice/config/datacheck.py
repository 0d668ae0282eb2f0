"""Checks of a valid config against its data, cheap enough for `lattice config check`: every source
path matches a file, the first file carries the columns the config reads, and the event-time
format parses the first rows. Each catches in a second what Spark would otherwise report minutes
into a run (or, for a wrong time format, not at all: every row would be quarantined as a bad
timestamp)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import re
from pathlib import Path

from lattice.config.loader import Problem
from lattice.config.schema import PlatformConfig, Source
from lattice.data.source_files import SourceError, file_columns, required_columns, source_files
from lattice.paths import Paths

SAMPLE_ROWS = 20
# tried in this order when the configured format fails; the first that parses every sample wins
CANDIDATES = ("yyyyMMddHH", "yyMMddHH", "yyyy-MM-dd", "yyyy-MM-dd HH:mm:ss", "iso", "unix_seconds", "unix_millis")
UTC = dt.timezone.utc

# ------------------------------------------------------------------ Spark patterns -> strptime

# (letter, count) -> (strptime directive, the digits or text Spark takes for it). strptime alone is
# too lenient: it reads '2' for MM, so 'yyyyMMddHH' would "parse" 14102100 as 1410-02-10, where
# Spark wants exactly two digits; the shape regex holds a value to Spark's widths.
_NUM2 = r"\d{2}"
_DIRECTIVES: dict[tuple[str, int], tuple[str, str]] = {
    ("y", 1): ("%Y", r"\d{1,4}"), ("y", 2): ("%y", _NUM2), ("y", 3): ("%Y", r"\d{3,4}"), ("y", 4): ("%Y", r"\d{4}"),
    **{(c, 1): ("%m", r"\d{1,2}") for c in "ML"}, **{(c, 2): ("%m", _NUM2) for c in "ML"},
    **{(c, 3): ("%b", "[a-z]{3}") for c in "ML"}, **{(c, 4): ("%B", "[a-z]+") for c in "ML"},
    ("d", 1): ("%d", r"\d{1,2}"), ("d", 2): ("%d", _NUM2),
    ("D", 1): ("%j", r"\d{1,3}"), ("D", 2): ("%j", r"\d{2,3}"), ("D", 3): ("%j", r"\d{3}"),
    ("H", 1): ("%H", r"\d{1,2}"), ("H", 2): ("%H", _NUM2), ("h", 1): ("%I", r"\d{1,2}"), ("h", 2): ("%I", _NUM2),
    ("m", 1): ("%M", r"\d{1,2}"), ("m", 2): ("%M", _NUM2), ("s", 1): ("%S", r"\d{1,2}"), ("s", 2): ("%S", _NUM2),
    # Spark reads 1 to n digits for n S's; %f takes at most 6, so longer fractions are not translated
    **{("S", n): ("%f", rf"\d{{1,{n}}}") for n in range(1, 7)},
    ("a", 1): ("%p", "[ap]m"), **{("E", n): ("%a", "[a-z]{3}") for n in (1, 2, 3)}, ("E", 4): ("%A", "[a-z]+"),
    **{(c, n): ("%z", r"z|[+-]\d{2}:?\d{2}") for c in "Xx" for n in (2, 3)},
    **{("Z", n): ("%z", r"[+-]\d{2}:?\d{2}") for n in (1, 2, 3)},
}
_RESERVED = set("[]{}#")


def translate(pattern: str) -> tuple[str, re.Pattern[str]] | None:
    """The `datetime.strptime` format of a Spark datetime pattern (`yyyy-MM-dd'T'HH:mm` ->
    `%Y-%m-%dT%H:%M`) and a regex of the value shape Spark accepts; None when the pattern uses
    letters or counts this does not translate (then it cannot be checked here)."""
    fmt, shape, i = [], [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "'":
            end = pattern.find("'", i + 1)
            if end < 0:
                return None
            text = "'" if end == i + 1 else pattern[i + 1:end]  # '' is a quote
            fmt.append(text.replace("%", "%%"))
            shape.append(re.escape(text))
            i = end + 1
        elif c.isascii() and c.isalpha():
            n = 1
            while i + n < len(pattern) and pattern[i + n] == c:
                n += 1
            if (c, n) not in _DIRECTIVES:
                return None
            directive, digits = _DIRECTIVES[(c, n)]
            fmt.append(directive)
            shape.append(f"(?:{digits})")
            i += n
        elif c in _RESERVED:
            return None  # optional sections and reserved characters
        else:
            fmt.append("%%" if c == "%" else c)
            shape.append(re.escape(c))
            i += 1
    return "".join(fmt), re.compile("".join(shape), re.IGNORECASE)  # Spark parses case-insensitively


def strptime_format(pattern: str) -> str | None:
    """The strptime twin of a Spark datetime pattern, or None (see `translate`)."""
    t = translate(pattern)
    return t[0] if t else None


# ------------------------------------------------------------------ parsing one value

# what Spark's CAST(string AS TIMESTAMP) takes: a date, optionally a time, optionally a zone
_ISO = re.compile(
    r"\s*([+-]?\d{4,6})(?:-(\d{1,2})(?:-(\d{1,2}))?)?"
    r"(?:[ T](\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,9}))?)?)?"
    r"\s*(Z|[+-]\d{1,2}(?::?\d{2}(?::?\d{2})?)?|(?:UTC|GMT|UT)(?:[+-]\d{1,2}(?::?\d{2})?)?"
    r"|[A-Za-z]+/[A-Za-z_]+(?:/[A-Za-z_]+)?)?\s*"
)
_TWO_DIGIT_YEAR = re.compile(r"(?<!y)yy(?!y)")
_OFFSET = re.compile(r"(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")


def _iso(v: str) -> dt.datetime:
    m = _ISO.fullmatch(v)
    if not m:
        raise ValueError(v)
    y, mo, d, h, mi, s, frac, zone = m.groups()
    micros = int((frac or "0")[:6].ljust(6, "0"))
    t = dt.datetime(int(y), int(mo or 1), int(d or 1), int(h or 0), int(mi or 0), int(s or 0), micros)
    off = _OFFSET.fullmatch(zone or "")
    if off:  # region names (Europe/Paris) are taken as UTC: a sample check needs no tz database
        sign, hh, mm, ss = off.groups()
        delta = dt.timedelta(hours=int(hh), minutes=int(mm or 0), seconds=int(ss or 0))
        t = t - delta if sign == "+" else t + delta
    return t


def _unix(v: str, scale: float) -> dt.datetime:
    x = float(v)  # Spark's try_cast to DOUBLE takes the same text (and trims it the same way)
    if math.isnan(x) or abs(x) * scale > 9.0e15:  # the ingest guard (pipelines/ingest.py)
        raise ValueError(v)
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=round(x * scale))


def parse_time(fmt: str, value: str) -> dt.datetime:
    """`value` read as event-time `fmt` would read it, as naive UTC; ValueError when it does not
    parse. Patterns without a strptime twin raise LookupError (they cannot be checked here)."""
    if fmt == "unix_seconds":
        return _unix(value, 1e6)
    if fmt == "unix_millis":
        return _unix(value, 1e3)
    if fmt == "iso":
        return _iso(value)
    translated = translate(fmt)
    if translated is None:
        raise LookupError(fmt)
    py, shape = translated
    if not shape.fullmatch(value):
        raise ValueError(f"{value!r} does not have the shape of {fmt!r}")
    try:
        t = dt.datetime.strptime(value, py)
    except re.error as exc:  # a letter given twice (strptime cannot)
        raise LookupError(fmt) from exc
    if _TWO_DIGIT_YEAR.search(re.sub(r"'[^']*'", "", fmt)) and t.year < 2000:
        t = t.replace(year=t.year + 100)  # Spark reads two-digit years as 2000-2099, Python 69-99 as 19xx
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t


# ------------------------------------------------------------------ reading the first rows


def _text(v: object) -> str | None:
    """A raw value as the Spark pipeline sees it: text (parquet columns are cast to string)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    return str(v)


def sample_values(source: Source, path: str, column: str, rows: int = SAMPLE_ROWS) -> list[str]:
    """Non-empty values of `column` in the first `rows` records of one file of `source`."""
    values: list[str | None] = []
    if source.format in ("csv", "tsv"):
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh, delimiter="," if source.format == "csv" else "\t")
            names = next(reader, []) if source.header else list(source.schema_columns or [])
            at = names.index(column)
            for i, row in enumerate(reader):
                if i >= rows:
                    break
                values.append(row[at] if at < len(row) else None)
    elif source.format == "parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=rows, columns=[column]), None)
        values = [_text(v) for v in batch.column(0).to_pylist()] if batch is not None else []
    else:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if len(values) >= rows:
                    break
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a malformed line is quarantined on its own; it says nothing of the format
                if isinstance(rec, dict):
                    values.append(_text(rec.get(column)))
    return [v for v in values if v not in (None, "")]  # empty is null: a missing time, not a format error


# ------------------------------------------------------------------ the checks


def _parses(fmt: str, values: list[str]) -> list[dt.datetime] | None:
    out = []
    for v in values:
        try:
            out.append(parse_time(fmt, v))
        except (ValueError, OverflowError):
            return None
    return out


def _in_range(config: PlatformConfig, times: list[dt.datetime]) -> bool:
    lo = dt.datetime.combine(config.time_range.start, dt.time())
    hi = dt.datetime.combine(config.time_range.end, dt.time())
    return any(lo <= t < hi for t in times)


def _suggestion(config: PlatformConfig, current: str, values: list[str]) -> str:
    for fmt in CANDIDATES:
        times = _parses(fmt, values) if fmt != current else None
        if times is not None and _in_range(config, times):
            return f"; try {fmt!r}"
    return ("; write the Spark datetime pattern of these values (e.g. 'yyyy-MM-dd HH:mm:ss') or use "
            "unix_seconds, unix_millis or iso")


def _time_problems(config: PlatformConfig, i: int, source: Source, path: str, notes: list[str]) -> list[Problem]:
    et = source.event_time
    if et.format == "constant" or et.column is None:
        return []
    where = f"sources[{i}].event_time.format"
    if et.format not in ("unix_seconds", "unix_millis", "iso") and strptime_format(et.format) is None:
        notes.append(f"{where}: {et.format!r} uses pattern letters this check does not translate (it knows y M d H h "
                     "m s S a E D X x Z); the sample check is skipped (Spark still applies it at ingest)")
        return []
    values = sample_values(source, path, et.column)
    if not values:
        notes.append(f"{where}: the first {SAMPLE_ROWS} rows of {path} have no `{et.column}` value to check")
        return []
    bad = []
    times = []
    for v in values:
        try:
            times.append(parse_time(et.format, v))
        except (ValueError, OverflowError):
            bad.append(v)
        except LookupError:
            notes.append(f"{where}: {et.format!r} cannot be checked here (a pattern letter repeats); skipped")
            return []
    shown = f"{path} (column `{et.column}`, e.g. {(bad or values)[0]!r})"
    if bad:
        return [Problem(where, et.format, f"fails on {len(bad)} of the first {len(values)} values of {shown}; Spark "
                        f"quarantines such rows as `bad_timestamp`{_suggestion(config, et.format, values)}")]
    if not _in_range(config, times):
        tr = config.time_range
        return [Problem(where, et.format, f"every sampled time of {shown} reads as outside time_range [{tr.start}, {tr.end}) "
                        f"(the first reads as {times[0]:%Y-%m-%d %H:%M} UTC), so Spark would quarantine its rows as "
                        "`timestamp_out_of_range`"
                        f"{_suggestion(config, et.format, values)}, or fix time_range")]
    return []


def _missing_root(config: PlatformConfig, root: Path) -> Problem:
    if config.synthetic is not None:
        fix = (f"the synthetic data is not generated yet: run `lattice synth --config {config.source_file or 'FILE'} "
               f"--out {root}` (or `lattice demo`, which generates it), or point data_root at existing logs")
    else:
        fix = "fix data_root (environment variables like ${LATTICE_SHARED_DATA:-...} expand in it) or fetch the data there"
    relative = ("" if Path(config.data_root).expanduser().is_absolute()
                else f" (a relative data_root starts at the current directory, {Path.cwd()})")
    return Problem("data_root", config.data_root, f"folder {root} does not exist{relative}; {fix}")


def data_problems(config: PlatformConfig, notes: list[str] | None = None) -> list[Problem]:
    """Every problem of `config`'s sources against the files they name; lines that are worth
    knowing but are not problems (a check that was skipped) are appended to `notes`."""
    notes = notes if notes is not None else []
    paths = Paths.for_config(config)
    out: list[Problem] = []
    root_missing = not paths.data_root.is_dir()
    if root_missing and any(not Path(s.path).expanduser().is_absolute() for s in config.sources):
        out.append(_missing_root(config, paths.data_root))
    for i, s in enumerate(config.sources):
        if root_missing and not Path(s.path).expanduser().is_absolute():
            continue  # reported once, as data_root
        try:
            first = source_files(paths, s)[0]
        except SourceError:
            out.append(Problem(f"sources[{i}].path", s.path, f"no file matches {paths.source_path(s.path)}; fix 'path' "
                               "(a file or a glob such as 'logs/*.csv' or '{dev,test}.csv', under data_root) or data_root"))
            continue
        try:
            have = file_columns(s, first)
            missing = [c for c in required_columns(s) if c not in have]
            if missing:
                out.append(Problem(f"sources[{i}]", s.name, f"{first} lacks column(s) {missing} that the config reads (it has "
                                   f"{have[:30]}); fix the source's mapping, header or schema_columns"))
                continue
            out += _time_problems(config, i, s, first, notes)
        except (OSError, ValueError, csv.Error) as exc:  # an unreadable file (pyarrow's errors are among these)
            out.append(Problem(f"sources[{i}].format", s.format, f"cannot read {first} as {s.format} "
                               f"({type(exc).__name__}: {exc}); fix 'format' or the file"))
    # modulo tables that merge many ids: from counts already on disk (a trained model's, else a
    # bounded read of the consolidated table), never a pass over the raw logs
    from lattice.hashing.collisions import config_check_notes

    try:
        notes += config_check_notes(config, paths)
    except (OSError, ValueError) as exc:  # an unreadable table is the feature stage's to report
        notes.append(f"collision check skipped: {type(exc).__name__}: {exc}")
    return out
