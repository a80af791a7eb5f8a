"""The picture of one replay per policy: the CDF of waits, the CDF of bounded slowdown, GPUs
in use over time, and each user's mean wait, drawn to a PNG (``corral sim --plot``,
``bench/sim_windows.py --plot``).

A table's means hide where a policy wins and loses: a lower mean wait bought by a long
tail, a utilisation lost in the drain after the last arrival. The CDFs show the whole
distribution and the GPUs-in-use curve shows when the cluster sat idle with work queued.

matplotlib is an optional extra (``pip install 'corral[plot]'``): imported only here, only
when drawing, with the Agg canvas (no display, no pyplot state shared between calls).
``Curves`` carries what the picture needs out of a ``SimResult`` in plain lists, so a
benchmark's worker processes can hand it back without the replay's objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corral.sim.results import SimResult

EXTRA = "plot"  # the pyproject extra that installs matplotlib
# fixed colours for the built-in policies, so every plot reads alike; variants take the rest
COLOURS = {"fifo": "#7f7f7f", "slurm": "#1f77b4", "corral": "#ff7f0e"}
SPARE = ("#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
WAIT_TICKS = ((0, "0"), (60, "1 min"), (600, "10 min"), (3600, "1 h"), (6 * 3600, "6 h"),
              (86400, "1 d"), (7 * 86400, "1 w"), (30 * 86400, "30 d"), (300 * 86400, "300 d"))
SLOWDOWN_TICKS = (1, 1.5, 2, 3, 5, 10, 30, 100, 300, 1000, 1e4, 1e5, 1e6)
TOP_USERS = 12  # the bar chart shows at most this many users, the worst waits first


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: says which extra brings it."""


@dataclass
class Curves:
    """One replay's series: per completed job its wait and bounded slowdown; the GPUs held
    from ``times[k]`` to ``times[k + 1]``; each user's mean wait."""

    waits: list[float]
    slowdowns: list[float]
    times: list[float]
    gpus: list[int]
    total_gpus: int
    first_submit: float
    last_submit: float
    user_waits: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, result: SimResult) -> Curves:
        times, gpus = result.gpus_in_use()
        submits = [o.job.submit_s for o in result.outcomes] or [0.0]
        return cls(result.waits(), result.slowdowns(), times, gpus, result.total_gpus, min(submits), max(submits),
                   result.metrics().get("user_mean_wait_s", {}))


def check_available() -> None:
    """Raise PlotUnavailable before a long replay, not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(f"drawing needs matplotlib: pip install 'corral[{EXTRA}]'") from None


def draw(runs: dict[str, Curves], path: Path, title: str = "") -> None:
    """Draw ``runs`` (label -> curves, in legend order) to ``path``; its suffix picks the
    format (png, svg, pdf …)."""
    check_available()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 9), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2)
    waits, slow = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    used, users = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    colours = _colours(runs)
    for label, c in runs.items():
        mean_wait = sum(c.waits) / len(c.waits) if c.waits else 0.0
        mean_slow = sum(c.slowdowns) / len(c.slowdowns) if c.slowdowns else 0.0
        _cdf(waits, c.waits, colours[label], f"{label} (mean {duration(mean_wait)})")
        _cdf(slow, c.slowdowns, colours[label], f"{label} (mean {mean_slow:,.2f})")
    # waits start at 0 (most jobs, on a cluster with room): linear up to a minute, log above
    longest = max((max(c.waits, default=0.0) for c in runs.values()), default=0.0)
    waits.set_xscale("symlog", linthresh=60.0)
    waits.set_xlim(0, max(120.0, longest * 1.2))
    _ticks(waits, [(t, name) for t, name in WAIT_TICKS if t <= max(120.0, longest * 1.2)])
    waits.set_xlabel("wait: submit to first start (linear to 1 min, log above)")
    waits.set_title("wait CDF")
    worst = max((max(c.slowdowns, default=1.0) for c in runs.values()), default=1.0)
    slow.set_xscale("log")
    slow.set_xlim(1.0, max(2.0, worst * 1.2))
    right = max(2.0, worst * 1.2)
    # 1.5 crowds 1 and 2 once the axis spans decades
    _ticks(slow, [(t, f"{t:g}") for t in SLOWDOWN_TICKS if t <= right and (t != 1.5 or right < 20)])
    slow.set_xlabel("bounded slowdown: JCT / max(run time, 10 s)")
    slow.set_title("bounded slowdown CDF")
    for ax in (waits, slow):
        ax.set_ylabel("share of jobs")
        ax.set_ylim(0, 1.0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    _in_use(used, runs, colours)
    _user_bars(users, runs, colours)
    if title:
        fig.suptitle(title)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def duration(seconds: float) -> str:
    """A span in the unit a reader thinks in: 45 s, 12 min, 3.1 h, 6.5 d."""
    for unit, name, limit in ((86400.0, "d", 2 * 86400), (3600.0, "h", 2 * 3600), (60.0, "min", 120)):
        if seconds >= limit:
            return f"{seconds / unit:,.1f} {name}"
    return f"{seconds:.0f} s"


def _ticks(ax, ticks: list[tuple[float, str]]) -> None:
    from matplotlib.ticker import NullFormatter, NullLocator

    ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _colours(runs: dict[str, Curves]) -> dict[str, str]:
    spare = iter(SPARE * (1 + len(runs) // len(SPARE)))
    return {label: COLOURS.get(label) or next(spare) for label in runs}


def _cdf(ax, values: list[float], colour: str, label: str) -> None:
    if not values:
        return
    xs = sorted(values)
    n = len(xs)
    ax.step(xs, [(k + 1) / n for k in range(n)], where="post", color=colour, label=label, linewidth=1.4)


def _in_use(ax, runs: dict[str, Curves], colours: dict[str, str]) -> None:
    origin = min((c.first_submit for c in runs.values()), default=0.0)
    end = max((c.times[-1] for c in runs.values() if c.times), default=origin)
    days = end - origin > 2 * 86400
    unit, name = (86400.0, "days") if days else (3600.0, "hours")
    total = max((c.total_gpus for c in runs.values()), default=0)
    for label, c in runs.items():
        if c.times:
            ax.step([(t - origin) / unit for t in c.times], c.gpus, where="post", color=colours[label], label=label,
                    linewidth=1.0, alpha=0.85)
    if total:
        ax.axhline(total, color="black", linewidth=0.8, linestyle="--", label=f"cluster ({total} GPUs)")
    last = max((c.last_submit for c in runs.values()), default=origin)
    ax.axvspan(0, (last - origin) / unit, color="#dddddd", alpha=0.5, label="jobs arriving")
    ax.set_xlabel(f"{name} since the first submission")
    ax.set_ylabel("GPUs in use")
    ax.set_title("GPUs in use over time")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    # below the axes: any corner of a busy cluster's curve is full of lines
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(runs) + 2, fontsize="small")


def _user_bars(ax, runs: dict[str, Curves], colours: dict[str, str]) -> None:
    worst: dict[str, float] = {}
    for c in runs.values():
        for user, wait in c.user_waits.items():
            worst[user] = max(worst.get(user, 0.0), wait)
    users = sorted(worst, key=lambda u: (-worst[u], u))[:TOP_USERS]
    width = 0.8 / max(1, len(runs))
    top = max(worst.values(), default=0.0)
    unit, name = (3600.0, "hours") if top >= 2 * 3600 else (60.0, "minutes") if top >= 120 else (1.0, "seconds")
    for k, (label, c) in enumerate(runs.items()):
        ax.bar([i + k * width for i in range(len(users))], [c.user_waits.get(u, 0.0) / unit for u in users], width,
               color=colours[label], label=label)
    ax.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(users))])
    ax.set_xticklabels([u[:10] for u in users], rotation=45, ha="right", fontsize="small")
    more = f" (the {TOP_USERS} worst of {len(worst)})" if len(worst) > TOP_USERS else ""
    ax.set_title(f"mean wait per user{more}")
    ax.set_ylabel(f"mean wait ({name})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
