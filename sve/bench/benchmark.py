"""The cost benchmark (``make bench``): SVE against the alternatives, measured in one process.

    sve-bench [--layers 1] [--repeats 3] [--device cpu|cuda] [--parts vit_s bert_base table5 front rule weights]

Every number comes from ``sve.bench.counters`` (interleaved rounds and paired medians for time, FlopCounterMode for
FLOPs, live-tensor peaks for memory; see its docstring) on random weights of the real shapes. On the CPU it
runs one thread unless ``--threads`` says otherwise: on a machine shared with other jobs, multi-threaded
small operators wait at thread barriers for a core that another process holds, and the times would measure
those processes (an optimiser step of 20 parameters took 1.4 s with 2 threads against 0.17 s with one).

Parts:

- ``vit_s`` (ViT-S/16: width 384, 6 heads, MLP 1536, 197 tokens; M = 4) and ``bert_base`` (BERT-base: width
  768, 12 heads, MLP 3072, sequence 128; M = 8): a training step (batch ``--train-batch`` per member) and
  evaluation at batch 16 per member and at batch 1, each as a ratio to M dense copies of the same backbone
  timed in the same round. Candidates: Single; SVE factored, SVE as configured by default (``inference`` and
  ``members_at_once`` auto), SVE with all members batched, SVE one member at a time with weights merged per
  call (no cache); the rebuild formulation (every member weight U diag(s_m) V^T materialised, with autograd,
  in every forward: a training reference); LoRA-Ensemble and BatchEnsemble as configured and, in evaluation,
  with SVE's default chunking (``members_at_once`` auto: any method can run it). M dense copies
  are measured as such in evaluation (a deep ensemble held in memory); their training step is M x the
  Single step, the same work (M independent fine-tunes) without holding M copies and their Adam moments.
  ``--layers`` transformer blocks are used (default 1): every candidate repeats the same per-block work and
  differs from the others only inside the blocks, so the ratios of a stack of blocks are those of one block,
  the embedding and the heads aside. Those are not negligible against one block: ViT-S's patch embedding
  costs 14% of a block's FLOPs, and SVE's members compute it once per batch where M dense copies compute it M
  times (``sve.layers.shared_inputs``), which one block weighs 12 times too much. So evaluation at batch 16 is also
  timed at the full depth for SVE and M dense copies (``--full-depth-eval``, default ViT-S; BERT's token
  embedding is a lookup), and its target is judged there too. ``--layers 12`` measures everything at the full
  depth. The lean-memory
  numbers (weights of SVE with float32 and bfloat16 factors against the single model, and the bfloat16
  reconstruction error) always use the full depth: they need no timing.
- ``table5``: Table 5's setting, BERT-base (12 layers), M = 8, batch 1, sequence 128: every method of
  configs/tables/table5.yaml that runs without a long fit (``--table5-methods``), Single, and two SVE
  variants beside the default (factored; factored with bfloat16 factors), each built alone (memory) and
  timed interleaved with Single; writes table5.json for ``make table5`` (schema: ``sve.paper.report.cost_runs``).
  Its target, SVE's batch-1 latency against LoRA-Ensemble's, is then timed directly: the two built side by
  side and timed against each other in the same rounds (3 x ``--repeats``), at the benchmark's thread count
  and, on a CPU, with every core (what one request waits for: PyTorch's default uses every core).
- ``front``: Table 5 as a front (``FRONT``): each method at its fast setting (its defaults) and its lean
  one (one member per pass; SVE factored with bfloat16 factors), stored and trainable parameters apart,
  inference memory at the full depth and latency against Single at batch 1 (full depth) and 16 (per block),
  with the rows no other row beats on both marked.
- ``rule``: one SV layer of each shape of the two settings, factored against cached and per-call merged
  weights over the tokens per member: the measurements behind ``sve.layers.sv_inference``'s rule.
- ``weights``: why batch 1 costs what it does. One layer of each shape, at the tokens per member of one
  example (ViT-S 197, BERT 128): M members through one shared weight (the base matmul of LoRA-Ensemble and
  BatchEnsemble), through a LoRA-Ensemble layer, through SVE's cached merged weights, and through one weight
  repeated M times in the same batched matmul. The last separates the two costs of distinct member weights:
  splitting one large matmul into M smaller ones, and reading M weights instead of one.

Writes ``<out>/{vit_s,bert_base,table5,front,rule,weights}.json`` (with the command, commit and versions) and
``<out>/bench.md`` (shown in docs/benchmark.md). ``--tiny``: tiny backbones, 1 round, for the tests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from sve.bench.ensemble import ensemble_part
from sve.bench.front import pareto_front_part
from sve.bench.layer_costs import rule_part, weights_part
from sve.bench.markdown import write_markdown
from sve.bench.settings import log, settings
from sve.bench.table5 import table5_part
from sve.runs.results import command_line, git_commit, package_versions, write_json
from sve.training.allocator import set_cpu_allocator


def run_parts(args, device: torch.device, known_parts: tuple[str, ...]) -> None:
    """Measures ``args.parts`` (the options of ``sve.cli.bench``) on ``device``, each written to
    ``<args.out>/<part>.json``, and the table of these and of the ``known_parts`` measured before to
    ``<args.out>/bench.md``."""
    allocator_tuned = set_cpu_allocator(args.cpu_allocator)
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    all_settings = settings(args.tiny)
    parts: dict = {
        "meta": {
            "command": command_line(),
            "git_commit": git_commit(),
            "versions": package_versions(),
            "threads": torch.get_num_threads(),
            "device": str(device),
            "cpu_allocator": args.cpu_allocator,
            "cpu_allocator_tuned": allocator_tuned,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        }
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.parts:
        start = time.perf_counter()
        if name in ("vit_s", "bert_base"):
            parts[name] = ensemble_part(all_settings[name], args, device)
        elif name == "table5":
            parts[name] = table5_part(all_settings["bert_base"], args, device)
        elif name == "front":
            parts[name] = pareto_front_part(all_settings["bert_base"], args, device)
        elif name == "rule":
            parts[name] = rule_part(args, device)
        else:
            parts[name] = weights_part(args, device)
        parts[name]["meta"] = {**parts["meta"], "seconds": time.perf_counter() - start}
        write_json(args.out / f"{name}.json", parts[name])
        log(f"{name}: {time.perf_counter() - start:.0f} s, written to {args.out / f'{name}.json'}")
    previous = {
        k: json.loads((args.out / f"{k}.json").read_text())
        for k in known_parts
        if k not in parts and (args.out / f"{k}.json").exists()
    }  # parts not rerun this time
    write_markdown(args.out, {**previous, **parts})
    log(f"table: {args.out / 'bench.md'}")
