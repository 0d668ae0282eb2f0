"""Config of time in the data: a synthetic market that moves over days, and durations such as an
objective's attribution window. Kept out of `schema.py` so that file only gains one field per use."""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal

from pydantic import Field, model_validator

from lattice.config.strict import Strict

_DURATION_RE = re.compile(r"^([1-9][0-9]*)([mhd])$")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> dt.timedelta:
    """`30m`, `12h`, `7d` -> a timedelta; anything else is a ValueError naming the accepted forms."""
    m = _DURATION_RE.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration; write a positive whole number and a unit: 30m, 12h or 7d")
    return dt.timedelta(seconds=int(m.group(1)) * _UNIT_SECONDS[m.group(2)])


class Shock(Strict):
    """One change on one day of the synthetic market: a domain's click rate moves (`domain` and
    `click_logit_shift`), or a feature's distribution changes (`feature` and `scale`)."""

    day: int = Field(ge=1)
    """The first day (counted from 0 at `time_range.start`) on which the change holds; it stays
    from then on."""
    domain: Literal["feed", "search", "video"] | None = None
    """The domain whose click logit moves by `click_logit_shift`."""
    click_logit_shift: float = 0.0
    """Added to that domain's click logit from `day` on (0.5 is about +60% clicks at a 5% rate)."""
    feature: Literal["price", "activity"] | None = None
    """The dense feature whose values are multiplied by `scale` from `day` on (in every domain; the
    true probabilities follow, since price and activity enter them)."""
    scale: float = Field(default=1.0, gt=0)
    """Multiplier of `feature`'s values from `day` on."""

    @model_validator(mode="after")
    def _one_kind(self) -> "Shock":
        if (self.domain is None) == (self.feature is None):
            raise ValueError("a shock changes either a domain's rate ('domain' + 'click_logit_shift') or a "
                             "feature's distribution ('feature' + 'scale'); give exactly one of 'domain' or 'feature'")
        if self.domain is not None and self.click_logit_shift == 0.0:
            raise ValueError("a domain shock needs a non-zero 'click_logit_shift' (e.g. 0.5)")
        if self.feature is not None and self.scale == 1.0:
            raise ValueError("a feature shock needs a 'scale' other than 1 (e.g. 1.5)")
        return self


class ConversionDelay(Strict):
    """When a conversion is logged after its impression: most within the hour, a share days later.
    A conversion that would arrive after the log ends is not in the raw log (its row stays
    unconverted, as a real export would show it); its true probability is still written."""

    delayed_share: float = Field(default=0.3, ge=0, le=1)
    """Share of conversions that arrive `min_days`-`max_days` late (uniform); the rest arrive
    within `prompt_hours` of the impression."""
    min_days: float = Field(default=1.0, ge=0)
    """Shortest late delay, in days."""
    max_days: float = Field(default=7.0, gt=0)
    """Longest late delay, in days (exclusive)."""
    prompt_hours: float = Field(default=1.0, gt=0)
    """The prompt conversions arrive uniformly within this many hours."""

    @model_validator(mode="after")
    def _ordered(self) -> "ConversionDelay":
        if self.max_days <= self.min_days:
            raise ValueError(f"max_days ({self.max_days}) must be greater than min_days ({self.min_days})")
        return self


class Market(Strict):
    """A market that moves over `synthetic.days`: new users and ads every day, slow click-rate
    drift per domain, an optional shock, and conversions logged after a random delay in their own
    `conversion_ts` column. Absent (the default), the generator writes the static logs it always did."""

    new_users_per_day: int = Field(default=0, ge=0)
    """Users first seen on each day after the first (ids never used before)."""
    new_ads_per_day: int = Field(default=0, ge=0)
    """Ads first seen on each day after the first (ids never used before)."""
    new_id_share: float = Field(default=0.1, ge=0, le=1)
    """Share of each day's impressions that go to that day's new users (and, drawn apart, to its
    new ads); the rest follow the Zipf popularity of the ids already known."""
    ctr_drift: float = Field(default=0.0, ge=0)
    """Standard deviation of each domain's daily random-walk step of the click logit (0.02 moves a
    5% rate by about 2% a day)."""
    shock: Shock | None = None
    """An optional one-day change that persists (see `Shock`)."""
    conversion_delay: ConversionDelay = Field(default_factory=ConversionDelay)
    """How late conversions are logged (see `ConversionDelay`)."""
    partition_by_date: bool = False
    """Write each domain's log into `date=YYYY-MM-DD/` folders (`feed/date=2026-01-03/part-00000.csv`),
    as date-partitioned exports arrive; the sources then read `feed/date={date}/*.csv`."""


class Zipper(Strict):
    """Zipper heads (`training.label_delay: zipper`): K windows W1 < ... < WK; every impression of
    an objective with an `attribution` window is hashed to one of them (lattice.data.zipper), labelled
    with what was known within it, and trains only that window's head once its window has closed at
    the training cutoff. Serving, export and evaluation read the longest window's head, so the
    artifact's outputs are those of a model without Zipper."""

    windows: list[str] = Field(min_length=2)
    """The windows, strictly increasing (`[1d, 3d, 7d]`). The longest may not exceed any delayed
    objective's `attribution` window nor the `time_range`; make it the attribution window, so the
    served head predicts the label as it finally matures."""
    shares: list[float] | None = None
    """Share of the impressions hashed to each window, in the order of `windows` (positive, summing
    to 1); unset: equal shares. A larger share for the longest window gives the served head more
    rows; the shorter ones bring fresher impressions into the shared layers."""

    @model_validator(mode="after")
    def _ordered(self) -> "Zipper":
        spans = [parse_duration(w) for w in self.windows]
        if any(b <= a for a, b in zip(spans, spans[1:])):
            raise ValueError(f"windows {self.windows} must be strictly increasing (W1 < ... < WK), e.g. [1d, 3d, 7d]")
        if self.shares is not None:
            if len(self.shares) != len(self.windows):
                raise ValueError(f"{len(self.shares)} shares for {len(self.windows)} windows; give one share per window or none")
            if any(s <= 0 for s in self.shares) or abs(sum(self.shares) - 1) > 1e-6:
                raise ValueError(f"shares {self.shares} must be positive and sum to 1, e.g. [0.3, 0.3, 0.4]")
        return self

    def spans(self) -> list[dt.timedelta]:
        return [parse_duration(w) for w in self.windows]

    def share_list(self) -> list[float]:
        return list(self.shares) if self.shares is not None else [1 / len(self.windows)] * len(self.windows)


def attribution_window(config, objective: str) -> dt.timedelta | None:
    """The objective's attribution window, or None when its label is known at the impression."""
    spec = next(o for o in config.objectives if o.name == objective).attribution
    return parse_duration(spec) if spec else None


def known_at_objectives(config) -> list[str]:
    """Objectives some source gives a label timestamp for (`labels.<objective>.known_at`): the
    consolidated table carries a `known_<objective>` column for each."""
    return [o for o in config.objective_names if any(s.labels.get(o) and s.labels[o].known_at for s in config.sources)]


def label_time_problems(config) -> list[tuple[str, object, str]]:
    """Config rules of label availability, as (key path, value, fix)."""
    out: list[tuple[str, object, str]] = []
    span = dt.datetime.combine(config.time_range.end, dt.time()) - dt.datetime.combine(config.time_range.start, dt.time())
    for i, o in enumerate(config.objectives):
        if o.attribution and parse_duration(o.attribution) > span:
            out.append((f"objectives[{i}].attribution", o.attribution,
                        f"longer than time_range ({config.time_range.start} to {config.time_range.end}, {span.days} days): no "
                        "impression's window could close inside the data; shorten the window or widen time_range"))
    out += zipper_problems(config, span)
    for i, s in enumerate(config.sources):
        for name, spec in s.labels.items():
            if not spec.known_at:
                continue
            if s.event_time.format == "constant":
                out.append((f"sources[{i}].labels.{name}.known_at", spec.known_at,
                            "the source's event_time is constant, so a label time cannot be compared with it; "
                            "give the source a real event_time column or drop known_at"))
            obj = next((o for o in config.objectives if o.name == name), None)
            if obj is not None and not obj.attribution:
                j = config.objectives.index(obj)
                out.append((f"objectives[{j}].attribution", None,
                            f"sources[{i}].labels.{name}.known_at gives positives a time, but without an attribution "
                            f"window no negative is ever final; add e.g. `attribution: 7d` to objective {name!r}"))
    return out


def zipper_problems(config, span: dt.timedelta) -> list[tuple[str, object, str]]:
    """`training.label_delay: zipper` and `training.zipper` agree with each other, the objectives'
    attribution windows and the time range."""
    tr = config.training
    z = tr.zipper
    if tr.label_delay != "zipper":
        if z is not None:
            return [("training.zipper", {"windows": z.windows}, f"only read with training.label_delay: zipper (it is "
                     f"{tr.label_delay!r}); set label_delay: zipper or remove training.zipper")]
        return []
    if z is None:
        return [("training.zipper.windows", None, "training.label_delay is 'zipper': give its windows, e.g. "
                 "`zipper: {windows: [1d, 3d, 7d]}` under training (the longest equal to the objective's attribution)")]
    delayed = [(i, o) for i, o in enumerate(config.objectives) if o.attribution]
    if not delayed:
        return [("training.label_delay", "zipper", "no objective has an attribution window, so there is nothing for "
                 "Zipper heads to wait for; add e.g. `attribution: 7d` to a delayed objective or use label_delay: mask")]
    out = []
    longest = z.spans()[-1]
    for i, o in delayed:
        if longest > parse_duration(o.attribution):
            out.append(("training.zipper.windows", z.windows,
                        f"the longest window ({z.windows[-1]}) exceeds objectives[{i}].attribution ({o.attribution} for "
                        f"{o.name!r}): a positive after the attribution window is never a label; make the last window "
                        f"at most {o.attribution}"))
    if longest > span:
        out.append(("training.zipper.windows", z.windows,
                    f"the longest window ({z.windows[-1]}) is longer than time_range ({span.days} days, the data kept): "
                    "no impression of its head could close inside the data; shorten the window or widen time_range"))
    return out
