"""``sve-generate <run dir> prompt=<text> [key=value ...]``: a trained run's ensemble writes answers, with each
member's own answer and the answers' uncertainty scores (``sve.api.generation``, docs/generation.md). The run's
backbone must be a Hugging Face causal LM (an ARC run's, any ``HFCausalLMBackbone``); its members write with the
LM's own lm_head under their adapted layers."""

# The command's own options, one line each; every other key=value overrides the run's config.
OPTIONS = {
    "run_dir": "the trained run's directory (or its adapter/ directory); may also come first, without run_dir=",
    "prompt": "one prompt (text, written as the run's data writes it, e.g. 'Question: ...\\nAnswer:')",
    "prompts_file": "a text file with one prompt per line (\\n inside a line stands for a line break)",
    "max_new_tokens": "at most this many tokens per answer (default 32)",
    "stop": "a stop string, \\n for a line break (default none: the end-of-sequence token and max_new_tokens)",
    "num_samples": "answers sampled from the predictive per prompt, for the semantic entropy (default 0)",
    "do_sample": "true: the answer is sampled from the predictive instead of its greedy choice (default false)",
    "temperature": "the sampling temperature (default 1)",
    "top_p": "nucleus sampling's probability mass (default 1: no cut)",
    "meaning": "how answers are compared: string (normalised match, default), minilm (sentence embeddings) or "
    "nli:<model id or directory> (entailment both ways)",
    "seed": "the sampling generator's seed (default 0)",
    "chat": "true: wrap each prompt in the tokenizer's chat template (default false: as the run's data wrote it)",
    "out": "a .jsonl file: one record per prompt (answer, member answers, samples, scores)",
}
DEFAULTS = {
    **dict.fromkeys(OPTIONS, ""),
    "max_new_tokens": "32",
    "num_samples": "0",
    "do_sample": "false",
    "temperature": "1",
    "top_p": "1",
    "meaning": "string",
    "seed": "0",
    "chat": "false",
}


def usage() -> str:
    options = "\n".join(f"  {key}=...{' ' * (16 - len(key))}{text}" for key, text in OPTIONS.items())
    return f"""usage: sve-generate <run dir> prompt=<text> [key=value ...]

{__doc__.split(": ", 1)[1]}

Options:
{options}

Any other key=value overrides the run's config (trainer.accelerator=cpu, backbone.name_or_path=DIR). The answer
and its scores are printed per prompt; out=<file> keeps them. SVE_DEBUG=1 shows the traceback of an error."""


def number(options: dict, key: str, kind: type, low: float | None = None):
    """``options[key]`` as ``kind``, or one line naming the value and what is valid."""
    from sve.errors import InputError

    try:
        value = kind(options[key])
    except ValueError:
        value = None
    if value is None or (low is not None and value < low):
        floor = f" >= {low}" if low is not None else ""
        raise InputError(f"{key}={options[key]!r} is not valid; give a {kind.__name__}{floor}")
    return value


def read_prompts(options: dict) -> list[str]:
    from pathlib import Path

    from sve.errors import InputError

    prompts = [options["prompt"]] if options["prompt"] else []
    if options["prompts_file"]:
        path = Path(options["prompts_file"]).expanduser()
        if not path.is_file():
            raise InputError(f"prompts_file={path}: no such file")
        prompts += [line for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise InputError("no prompt: give prompt=<text> or prompts_file=<file> (one prompt per line)")
    return [p.replace("\\n", "\n") for p in prompts]


def check_writer(directory) -> None:
    """Refuses, before the model is built, a run whose backbone is not a causal LM (nothing there can write)."""
    from hydra.utils import get_class

    from sve.api import adapter_files
    from sve.backbones.hf import HFCausalLMBackbone
    from sve.errors import InputError
    from sve.runs.eval_config import adapter_run_config, saved_config

    adapter = (directory / adapter_files.CONFIG).is_file()
    cfg = adapter_run_config(directory) if adapter else saved_config(directory)
    target = cfg.backbone.get("_target_", "")
    try:
        writes = issubclass(get_class(target), HFCausalLMBackbone)
    except (ImportError, ValueError, TypeError):
        writes = False
    if not writes:
        raise InputError(
            f"sve-generate needs a run whose backbone is a causal LM (sve.backbones.HFCausalLMBackbone or a subclass); "
            f"{directory} was trained with backbone={cfg.backbone.get('name')} ({target})"
        )


def generate_from_run(argv: list[str]) -> int:
    """``sve-generate``'s arguments, then the run's model loaded (``load_run``) and its answers written."""
    import json
    from pathlib import Path

    import torch

    from sve.api.generation import generate
    from sve.cli.run_options import command_options
    from sve.errors import InputError
    from sve.metrics.sequence import check_meaning
    from sve.runs.reevaluate import load_run, model_directory

    options, overrides = command_options(argv, DEFAULTS)
    if not options["run_dir"]:
        raise InputError(f"no run directory among the arguments {argv}; give it first or as run_dir=<run dir>")
    for key in ("do_sample", "chat"):
        if options[key] not in ("true", "false"):
            raise InputError(f"{key}={options[key]!r} is not valid; expected true or false")
    check_meaning(options["meaning"])
    settings = {
        "max_new_tokens": number(options, "max_new_tokens", int, 1),
        "num_samples": number(options, "num_samples", int, 0),
        "temperature": number(options, "temperature", float),
        "top_p": number(options, "top_p", float),
        "do_sample": options["do_sample"] == "true",
        "chat": options["chat"] == "true",
        "meaning": options["meaning"],
        "stop_strings": [options["stop"].replace("\\n", "\n")] if options["stop"] else [],
        "generator": torch.Generator().manual_seed(number(options, "seed", int)),
    }
    prompts = read_prompts(options)
    directory = model_directory(Path(options["run_dir"]).expanduser())
    check_writer(directory)
    _, _, module, _ = load_run(directory, overrides, trainer=False)
    result = generate(module.method, prompts, **settings)
    records = []
    for b, prompt in enumerate(prompts):
        record = {
            "prompt": prompt,
            "answer": result.texts[b],
            "member_answers": [texts[b] for texts in result.member_texts or []],
            "samples": (result.samples or [[]] * len(prompts))[b],
            "scores": {name: float(values[b]) for name, values in result.scores.items()},
        }
        records.append(record)
        scores = ", ".join(f"{k} {v:.4g}" for k, v in record["scores"].items())
        print(f"{prompt!r} -> {record['answer']!r}\n  members: {record['member_answers']}\n  {scores}")
    if options["out"]:
        out = Path(options["out"]).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in records))
        print(f"wrote {out}")
    return 0


def main() -> None:
    from sve.cli.run_options import run_command

    run_command(usage, generate_from_run)


if __name__ == "__main__":
    main()
