"""Tables and plots from benchmarks/cluster.py's results: gains, the cost model against the measured steps,
and its curves of step time vs bucket size and vs world size (docs/img/cluster_costmodel.png)."""

from __future__ import annotations

import os

from strategies.costmodel import LinkCost, best_layout, buckets_for_cap, predict, sweep_caps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOT = os.path.join(ROOT, "docs", "img", "cluster_costmodel.png")
RATES = ("unlimited", "1gbit", "300mbit", "100mbit")
METHODS = ("tandem_auto", "tandem_cap25", "torch_ddp", "flat", "no_comm")
AGAIN = "tandem_cap25_again"  # --aa: a second copy of cap 25, whose ratio to the first is the noise floor


def _cost(a: dict) -> LinkCost:
    """The cost model auto fitted (older result files have no CPU share: none)."""
    cpu = (a.get("cpu_alpha_s", 0.0), a.get("cpu_beta_s", 0.0), a.get("compute_rate", 1.0))
    return LinkCost(a["alpha_s"], a["beta_s"], *cpu)


def summarise(results: dict) -> list[dict]:
    """One row per (rate, model): ms/step per method, gains, and the cost model's prediction."""
    rows = []
    for rate, by_model in results.items():
        for name, m in by_model.items():
            nc, flat, auto = m["no_comm"], m["flat"], m["tandem_auto"]
            a = auto.get("auto")
            ideal = nc["forward"] + max(nc["backward"] + nc["optim"], flat["allreduce"])
            row = {"rate": rate, "model": name, **{k: m[k]["step"] for k in METHODS}}
            row.update(
                allreduce_ms=flat["allreduce"],
                gain_auto=flat["step"] / auto["step"],
                gain_cap25=flat["step"] / m["tandem_cap25"]["step"],
                gain_ideal=flat["step"] / ideal,
                auto_vs_cap25=auto["step"] / m["tandem_cap25"]["step"],
                again_vs_cap25=m[AGAIN]["step"] / m["tandem_cap25"]["step"] if AGAIN in m else None,
                auto_buckets_mb=auto.get("bucket_mb"),
            )
            if a is not None:
                # the layout auto ended with: its choice, or the 25 MB one (kept, or back after the trial)
                in_use = a[
                    "predicted_step_s_cap25" if a["kept_cap25"] or a.get("reverted") else "predicted_step_s"
                ]
                row.update(
                    predicted_auto=1e3 * in_use,
                    predicted_cap25=1e3 * a["predicted_step_s_cap25"],
                    predicted_choice=1e3 * a["predicted_step_s"],
                    trial="-" if a["kept_cap25"] else ("reverted" if a.get("reverted") else "kept"),
                    cpu_share_ms=[1e3 * v for v in a.get("probes_cpu_s", {}).values()],
                    compute_rate=a.get("compute_rate", 1.0),
                    error_auto=1e3 * in_use / auto["step"] - 1,
                    error_cap25=1e3 * a["predicted_step_s_cap25"] / m["tandem_cap25"]["step"] - 1,
                    alpha_us=1e6 * a["alpha_s"],
                    mb_per_s=1 / a["beta_s"] / 1e6 if a["beta_s"] else float("inf"),
                )
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    head = "| rate | model | auto | cap 25 | torch DDP | flat | no comm | auto/25 | gain auto | gain 25 | ideal | pred auto (err) | pred 25 (err) | trial | auto buckets MB |"
    if rows and rows[0].get("again_vs_cap25") is not None:
        head += " A/A |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        pred = [
            f"{r[p]:.1f} ({100 * r[e]:+.0f}%)" if p in r else "-"
            for p, e in (("predicted_auto", "error_auto"), ("predicted_cap25", "error_cap25"))
        ]
        buckets = ", ".join(f"{mb:.2f}" for mb in r["auto_buckets_mb"] or [])
        print(
            f"| {r['rate']} | {r['model']} | {r['tandem_auto']:.1f} | {r['tandem_cap25']:.1f} | {r['torch_ddp']:.1f} |"
            f" {r['flat']:.1f} | {r['no_comm']:.1f} | {r['auto_vs_cap25']:.3f} | {r['gain_auto']:.2f} |"
            f" {r['gain_cap25']:.2f} | {r['gain_ideal']:.2f} | {pred[0]} | {pred[1]} | {r.get('trial', '-')} | {buckets} |"
            + (f" {r['again_vs_cap25']:.3f} |" if r.get("again_vs_cap25") is not None else "")
        )


def curves(results: dict) -> dict:
    """Predicted step time (ms) vs bucket cap and vs world size, from each run's measured numbers."""
    caps, worlds = [0.01, 0.03, 0.1, 0.3, 1, 3, 10, 25, 100], [2, 4, 8, 16, 32, 64, 128, 256]
    out: dict = {"caps_mb": caps, "world_sizes": worlds, "by_cap": {}, "by_world": {}}
    for rate, by_model in results.items():
        for name, m in by_model.items():
            a = m["tandem_auto"].get("auto")
            if a is None:
                continue
            ready, sizes, cost = a["ready_s"], m["tandem_auto"]["sizes"], _cost(a)
            order = [i for b in a["buckets"] for i in b]
            key = f"{rate}/{name}"
            sweep = sweep_caps(ready, sizes, order, cost, 2, caps, forward_s=a["outside_s"])
            out["by_cap"][key] = [1e3 * p.step_s for _, p in sweep]
            by_world = {"auto": [], "cap25": []}
            for p in worlds:
                for label, buckets in (
                    ("auto", best_layout(ready, sizes, order, cost, p, None, a["outside_s"])),
                    ("cap25", buckets_for_cap(sizes, order, 25.0)),
                ):
                    by_world[label].append(
                        1e3 * predict(ready, sizes, buckets, cost, p, a["outside_s"]).step_s
                    )
            out["by_world"][key] = by_world
    return out


def plot(c: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib, or `make bench`)")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(dict.fromkeys(key.split("/")[1] for key in c["by_cap"]))
    colors = {name: f"C{k}" for k, name in enumerate(names)}
    styles = dict(zip(RATES, ("-", "--", "-.", ":")))
    at25 = c["caps_mb"].index(25)
    for key, ys in c["by_cap"].items():
        rate, name = key.split("/")
        rel = [y / ys[at25] for y in ys]  # relative to 25 MB buckets: the shape, whatever the step's length
        left.plot(c["caps_mb"], rel, marker="o", ms=3, ls=styles[rate], color=colors[name], label=key)
    left.set(
        xscale="log",
        xlabel="bucket cap (MB)",
        ylabel="predicted step / step with 25 MB buckets",
        title="vs bucket size (2 ranks; tiny caps reach 4.5x, off the scale)",
        ylim=(0.85, 1.5),
    )
    for key, ys in c["by_world"].items():
        rate, name = key.split("/")
        right.plot(
            c["world_sizes"], ys["auto"], marker="o", ms=3, ls=styles[rate], color=colors[name], label=key
        )
        right.plot(
            c["world_sizes"], ys["cap25"], marker="x", ms=4, ls=styles[rate], color=colors[name], alpha=0.4
        )
    right.set(
        xscale="log",
        yscale="log",
        xlabel="ranks",
        ylabel="predicted ms/step",
        title="vs world size (o: best layout, x faint: 25 MB buckets)",
    )
    left.legend(fontsize=6)
    right.legend(fontsize=6)
    fig.tight_layout()
    os.makedirs(os.path.dirname(PLOT), exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    print(f"plot: {PLOT}")
