"""A run on a subset of domains or objectives: the config the model stages see, restricted.

Stages build heads, cells and reports from `config.domains` / `config.objectives`, so a subset
chosen at trigger time becomes a narrowed config rather than a keyword every stage must know.
Features (including aggregates of a dropped objective) stay as they are: the model's inputs do
not change, only which (domain, objective) cells it is trained and judged on. A domain subset also
narrows the rows: the task runner gives the stage a copy of the training table holding only the
chosen domains (`run_paths.subset_table`), since the loader refuses rows of undeclared domains.
"""

from __future__ import annotations

from typing import Any

from lattice.config import PlatformConfig


class SubsetError(ValueError):
    pass


def narrow_config(config: PlatformConfig, domains: list[str] | None = None,
                  objectives: list[str] | None = None) -> PlatformConfig:
    keep_d = list(config.domain_names if domains is None else domains)
    keep_o = list(config.objective_names if objectives is None else objectives)
    if keep_d == config.domain_names and keep_o == config.objective_names:
        return config
    for kind, chosen, known in (("domains", keep_d, config.domain_names), ("objectives", keep_o, config.objective_names)):
        unknown = sorted(set(chosen) - set(known))
        if unknown or not chosen:
            raise SubsetError(f"{kind} {unknown or chosen} are not a subset of the config's {kind} {known}")
    data: dict[str, Any] = config.model_dump(mode="python")
    data["domains"] = [d for d in data["domains"] if d["name"] in keep_d]
    objs = []
    for o in data["objectives"]:
        if o["name"] in keep_o:
            o["domains"] = [d for d in o["domains"] if d in keep_d]
            if not o["domains"]:
                raise SubsetError(f"objective {o['name']!r} has no label in the chosen domains {keep_d}; "
                                  f"add one of {[d for d in config.objectives[config.objective_names.index(o['name'])].domains]}")
            objs.append(o)
    data["objectives"] = objs
    sources = []
    for s in data["sources"]:
        if isinstance(s["domain"], str):
            if s["domain"] not in keep_d:
                continue
        else:
            s["domain"]["map"] = {k: v for k, v in s["domain"]["map"].items() if v in keep_d}
            if s["domain"].get("default") not in keep_d:
                s["domain"]["default"] = None
            if not s["domain"]["map"] and s["domain"]["default"] is None:
                continue
        s["labels"] = {o: spec for o, spec in s["labels"].items() if o in keep_o}
        s["truth"] = {o: col for o, col in s["truth"].items() if o in keep_o}
        sources.append(s)
    data["sources"] = sources
    # aggregates may count a dropped objective's labels: they stay, as model inputs
    narrowed = PlatformConfig.model_validate(data)
    narrowed._source_file = config.source_file
    narrowed._services = config._services  # the run's engines, resolved once (lattice.deploy.profile)
    return narrowed
