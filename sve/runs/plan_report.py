"""A memory plan (``sve.runs.plan``) in words: the lines ``plan=true`` prints, its verdict and the settings that
would make it fit, and the one-line summary a table's plan prints per row."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from sve.paths import CONFIGS
from sve.runs.layout import Layout, gib
from sve.runs.plan import Plan, device_share, plan
from sve.runs.resolvers import compose_run


def format_plan(p: Plan) -> str:
    """The plan as the lines ``plan=true`` prints."""
    d = p.per_device
    rows = [f"memory plan: {p.title}", f"  per device, GiB (capacity {gib(p.capacity)}):"]
    shard = f" (1/{p.layout.devices} of it per device)" if p.layout.strategy == "fsdp" else ""
    for kind, n in p.stored.items():
        rows.append(f"    {kind:<34}{gib(n):>9}  exact{shard}")
    if d["gathered"]:
        rows.append(f"    {'FSDP gathered units':<34}{gib(d['gathered']):>9}  exact")
    rows.append(f"    {'gradients':<34}{gib(d['gradients']):>9}  exact")
    rows.append(f"    {'optimizer state':<34}{gib(d['optimizer state']):>9}  exact")
    if d["ddp buckets"]:
        rows.append(f"    {'DDP gradient buckets':<34}{gib(d['ddp buckets']):>9}  exact")
    if d["context"]:
        rows.append(f"    {'CUDA context':<34}{gib(d['context']):>9}  estimate")
    rows.append(f"    {'activations (training)':<34}{gib(p.train['activations']):>9}  estimate")
    for name, alt in p.alternatives.items():
        rows.append(
            f"      with {name:<29}{gib(alt['activations']):>9}  estimate (training peak {gib(alt_peak(p, alt))})"
        )
    rows.append(f"    {'merged cache (evaluation)':<34}{gib(p.eval['merged cache']):>9}  exact")
    rows.append(f"    {'training peak':<34}{gib(p.train_peak):>9}  estimate")
    rows.append(f"    {'evaluation peak':<34}{gib(p.eval_peak):>9}  estimate")
    rows += [f"  note: {n}" for n in p.notes]
    rows.append("  " + verdict(p))
    return "\n".join(rows)


def alt_peak(p: Plan, alt: dict[str, int]) -> int:
    """The training peak per device with the step ``alt`` measured instead of the configured one."""
    return device_share(p.stored, alt, p.eval, p.layout, p.unit)["train_peak"]


def verdict(p: Plan) -> str:
    """Fits, or which parts exceed the capacity and by how much, and the settings that bring it under."""
    worst = max(p.train_peak, p.eval_peak)
    phase = "training" if p.train_peak >= p.eval_peak else "evaluation"
    if p.fits:
        return f"fits: {phase} peak {gib(worst)} GiB of {gib(p.capacity)} GiB ({gib(p.capacity - worst)} GiB left)"
    parts = dict(p.stored)
    parts["activations"] = p.train["activations"]
    if p.eval["merged cache"]:
        parts["merged cache"] = p.eval["merged cache"]
    big = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    lines = [
        f"does not fit: {phase} peak {gib(worst)} GiB exceeds {gib(p.capacity)} GiB by "
        f"{gib(worst - p.capacity)} GiB; largest parts: "
        + ", ".join(
            f"{k} {gib(v)} GiB" + (f" (alone over by {gib(v - p.capacity)} GiB)" if v > p.capacity else "")
            for k, v in big
        )
    ]
    fixes = []
    for name, alt in p.alternatives.items():
        peak = alt_peak(p, alt)
        if peak < p.train_peak:
            fixes.append(f"{name}: training peak {gib(peak)} GiB" + (" (fits)" if peak <= p.capacity else ""))
    factors = p.stored.get("factors (U, V)", 0)
    if p.sv_shapes and factors:
        # Exact parameter bytes of the alternatives; the rest of the step taken as measured for this method.
        rank = int(OmegaConf.load(CONFIGS / "method" / "sve_top.yaml").top_rank)
        top = sum((o * i + rank * (o + i)) * size for o, i, size in p.sv_shapes)
        fixes.append(
            f"method=sve_top (r = {rank}): W_res and factors {gib(top)} GiB instead of "
            f"{gib(factors)} GiB, training peak about {gib(p.train_peak - factors + top)} GiB"
        )
        if min(size for *_, size in p.sv_shapes) > 2:
            fixes.append(
                f"method.factor_dtype=bfloat16: factors {gib(factors // 2)} GiB, training peak about "
                f"{gib(p.train_peak - factors // 2)} GiB"
            )
    if p.layout.strategy != "fsdp":
        for N in (2, 4, 8):
            layout = Layout(p.layout.device, N, "fsdp", p.layout.precision, p.layout.accumulate)
            share = device_share(p.stored, p.train, p.eval, layout, p.unit)
            if max(share["train_peak"], share["eval_peak"]) <= p.capacity:
                fixes.append(
                    f"trainer=fsdp trainer.devices={N}: about {gib(share['train_peak'])} GiB per "
                    "device (the same global batch split over the devices would lower the activations too)"
                )
                break
    lines.append("  to bring it under: " + ("; ".join(fixes) if fixes else "no single setting measured here does"))
    return "\n  ".join(lines)


def print_plan(cfg: DictConfig) -> Plan:
    p = plan(cfg)
    print(format_plan(p))
    return p


def plan_line(overrides: list[str]) -> str:
    """The plan of the run ``sve-train <overrides>`` as one summary line (what ``plan_tables`` prints per row)."""
    return summary_line(plan(compose_run(overrides), alternatives=False))


def summary_line(p: Plan) -> str:
    """Training and evaluation peaks per device and the verdict, in one line."""
    layout = p.layout
    head = (
        f"{layout.devices}x {layout.device} {layout.strategy} {layout.precision}: training {gib(p.train_peak)} GiB "
        f"(stored {gib(p.per_device['stored'])}, activations {gib(p.train['activations'])}), evaluation "
        f"{gib(p.eval_peak)} GiB (merged cache {gib(p.eval['merged cache'])})"
    )
    worst = max(p.train_peak, p.eval_peak)
    verdict = "fits" if p.fits else f"over by {gib(worst - p.capacity)} GiB"
    return f"{head}; {verdict} {gib(p.capacity)} GiB"
