"""Plots logged with every model: per-cell NE/AUC bars and the training curves."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    return plt


def cell_bars(cells: dict[str, dict[str, float]], title: str, out: Path) -> Path | None:
    """`cells`: "domain/objective" -> {"ne": .., "auc": ..}."""
    names = sorted(cells)
    if not names:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.2 * len(names)), 3.5))
    for ax, key in zip(axes, ("ne", "auc")):
        ax.bar(names, [cells[n].get(key, float("nan")) for n in names], color="#4c72b0")
        ax.set_title(f"{title}: {key.upper()} per cell")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def history_curves(history: list[dict], title: str, out: Path) -> Path | None:
    """`history`: one dict per epoch (or step) of numeric values; every numeric key is a line."""
    if not history or not isinstance(history, list) or not isinstance(history[0], dict):
        return None
    keys = sorted({k for h in history for k, v in h.items() if isinstance(v, (int, float)) and k not in ("epoch", "step")})
    if not keys:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k in keys:
        ax.plot([h.get(k, float("nan")) for h in history], label=k, marker="o")
    ax.set_title(f"{title}: training history")
    ax.set_xlabel("epoch")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
