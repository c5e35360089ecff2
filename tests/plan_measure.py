"""Measures, in a fresh process, the resident memory one real training step takes on the CPU, for
tests/runs/test_plan.py to compare with the memory plan (``sve.runs.plan``).

``python tests/plan_measure.py '<JSON list of overrides>' <random_factors: 0|1>`` prints one JSON line:
``stored`` (parameter and buffer bytes), ``before`` (resident bytes just before the step) and ``peak``
(the resident high-water mark during the step, reset just before it). The step is the plan's own
(``sve.runs.plan.train_step``: forward, backward, AdamW step) on real tensors of the plan's batch shape.

With ``random_factors`` the SVD is replaced by random factors of the same shapes and dtypes: the memory is
the same, and an SVD of a 4096 x 11008 matrix takes minutes on two cores.
"""

import ctypes
import gc
import json
import sys

# Freed memory goes straight back to the system (every block above 64 KiB is its own mapping, and the heap
# is trimmed at once), so the resident set follows the bytes alive and its high-water mark is their peak.
# glibc's defaults would keep freed blocks for reuse (and so would cpu_allocator=tuned, sve/training/allocator.py),
# hiding what the step allocates inside what the build freed.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
libc = ctypes.CDLL("libc.so.6")
libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
libc.mallopt(M_TRIM_THRESHOLD, 0)

import torch  # noqa: E402 - after the allocator policy, which must be set before the first allocation

torch.set_num_threads(1)


def resident(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def random_decompose(layer, svd_dtype=torch.float64, factor_dtype=None, cache=None):
    from sve.layers.member import weight_matrix

    W = weight_matrix(layer)
    (out, inner), dtype = W.shape, factor_dtype or W.dtype
    r = min(out, inner)
    return torch.randn(out, r, dtype=dtype), torch.rand(r, dtype=svd_dtype) + 0.5, torch.randn(r, inner, dtype=dtype)


def main() -> None:
    overrides, random_factors = json.loads(sys.argv[1]), sys.argv[2] == "1"
    from hydra import compose, initialize_config_dir

    import sve.runs.resolvers  # noqa: F401
    from sve.layers.draws import unfuse_attention_dropout
    from sve.paths import CONFIGS
    from sve.runs import layout, plan
    from sve.runs.run import instantiate

    if random_factors:
        import sve.layers.sv_linear
        import sve.layers.sv_top

        sve.layers.sv_linear.decompose = sve.layers.sv_top.decompose = random_decompose
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    backbone = instantiate(cfg.backbone)
    datamodule = instantiate(cfg.dataset)
    datamodule.attach(backbone)
    method_node = cfg.method.copy()
    if "svd_cache" in method_node:
        method_node.svd_cache = None
    method = instantiate(
        method_node,
        backbone=backbone,
        ensemble_size=int(cfg.ensemble_size),
        num_classes=datamodule.num_classes,
        task=cfg.dataset.name,
    )
    if cfg.get("exact_draws", True):
        unfuse_attention_dropout(method.backbone)
    stored = sum(plan.stored_bytes(method).values())
    batch = plan.example_batch(datamodule, backbone, int(cfg.dataset.batch_size))
    factory = plan.optimizer_factory(cfg, method)
    how = layout.PRECISIONS[str(cfg.trainer.get("precision", "32-true") or "32-true")]
    gc.collect()
    before = resident("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    plan.train_step(method, batch, factory, how, cfg.trainer.get("gradient_clip_val"))
    print(json.dumps({"stored": stored, "before": before, "peak": resident("VmHWM")}))


if __name__ == "__main__":
    main()
