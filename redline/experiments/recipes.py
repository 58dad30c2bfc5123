"""Recipes: a declarative matrix of training runs, and its expansion into one config per run.

A recipe is a TOML or YAML file (the built-in ones are in recipes/ next to this module):

    name = "ablations"
    description = "baseline vs each single change"
    presets = ["modern-124m"]              # model sizes
    precision = ["bf16"]                   # auto | fp32 | bf16 | fp8 | fp8-auto   (see PRECISIONS)
    batch = [[16, 1024]]                   # [batch_size, seq_len] pairs (0 keeps the preset's value) ...
    # batch_size = [8, 16]  seq_len = [1024]   ... or two lists, crossed
    seeds = [1, 2, 3]
    budget = { max_steps = 150 }           # any of max_steps, max_tokens, max_time (minutes)
    data = "data/corpus"                   # data.path ("" or absent: the embedded default; --data overrides)
    baseline = { variant = "baseline" }    # what each configuration is compared with (report and claims)
    keep_checkpoints = false               # delete each run's checkpoints once it is summarized
    timeout_minutes = 30                   # a run still going after this is killed and marked failed
    command = ["{python}", "-m", "redline", "train"]   # the runner ({python}: this interpreter)

    [set]                                  # TrainConfig overrides for every run, dotted or nested
    eval_every = 50

    [[variants]]                           # one configuration change each; may also replace any axis list
    name = "mqa"
    description = "multi-query attention"
    set = { "model.n_kv_head" = 1 }

A string value may name another run of the same sweep: "{runs}" is the sweep's run folder, and {preset},
{precision}, {batch} (e.g. 16x1024) and {seed} are this run's axis values, so a fine-tune can start from the
pretrained run of its own size and seed: init_from = "{runs}/pretrain__{preset}__{precision}__{batch}__s{seed}"
(variants run in the order the recipe lists them, so put that pretraining first).

The matrix is presets × precision × batch × variants × seeds, seeds outermost: a sweep cut short has
every configuration at seed 1 before any at seed 2. Each run gets a YAML config file that `redline train
--config FILE` reads (so `redline train --config SWEEP/configs/RUN.yaml` reproduces it alone), and a
fingerprint of what it asks for, so a resumed sweep knows a finished run from a changed one.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from redline.errors import UserError, one_line, read_text_file

# precision axis value -> TrainConfig overrides. "bf16" also turns FP8 off where the fp8 option exists, so
# that an `fp8 = "auto"` default can never slip FP8 into a run labelled bf16.
PRECISIONS: dict[str, dict[str, Any]] = {
    "auto": {},
    "fp32": {"precision": "fp32"},
    "bf16": {"precision": "bf16"},
    "fp8": {"precision": "bf16", "fp8": "all"},
    "fp8-auto": {"precision": "bf16", "fp8": "auto"},
}
BUDGET_KEYS = ("max_steps", "max_tokens", "max_time")
AXES = ("variant", "preset", "precision", "batch_size", "seq_len")  # a cell: one configuration over seeds
# every sweep run: no sample at the end, no TensorBoard files (metrics.jsonl has everything the report reads)
SWEEP_DEFAULTS: dict[str, Any] = {"sample_tokens": 0, "tensorboard": False}
DEFAULT_COMMAND = ["{python}", "-m", "redline", "train"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_TOP_KEYS = {"name", "description", "presets", "precision", "batch", "batch_size", "seq_len", "seeds", "budget",
             "data", "baseline", "keep_checkpoints", "timeout_minutes", "command", "set", "variants"}
_VARIANT_KEYS = {"name", "description", "set", "presets", "precision", "batch", "batch_size", "seq_len", "seeds"}


@dataclass
class Variant:
    name: str
    description: str = ""
    set: dict[str, Any] = field(default_factory=dict)  # dotted TrainConfig key -> value
    axes: dict[str, list] = field(default_factory=dict)  # presets / precision / batch / seeds it replaces


@dataclass
class Recipe:
    name: str
    description: str
    presets: list[str]
    precision: list[str]
    batch: list[tuple[int, int]]  # (batch_size, seq_len); 0 = leave the preset's value
    seeds: list[int]
    budget: dict[str, float]
    variants: list[Variant]
    set: dict[str, Any] = field(default_factory=dict)
    data: str | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    keep_checkpoints: bool = False
    timeout_minutes: float | None = None
    command: list[str] = field(default_factory=lambda: list(DEFAULT_COMMAND))
    source: str = ""  # where it came from: a path or builtin:NAME

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """One run of the matrix: where it sits on each axis and every override it passes to `redline train`."""

    run_id: str
    variant: str
    preset: str
    precision: str
    batch_size: int  # 0: the preset's default
    seq_len: int  # 0: the model's context
    seed: int
    overrides: dict[str, Any]  # dotted TrainConfig key -> value (preset excluded)

    @property
    def cell(self) -> dict[str, Any]:
        return {axis: getattr(self, axis) for axis in AXES}

    def fingerprint(self, command: list[str]) -> str:
        blob = json.dumps({"command": command, "preset": self.preset, "overrides": self.overrides},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def config_file_contents(self, out_dir: Path) -> dict[str, Any]:
        """What goes into the run's YAML config: preset, overrides, and where the run directory goes."""
        batch = f"{self.batch_size or 'd'}x{self.seq_len or 'd'}"
        overrides = {k: v.format(runs=out_dir, preset=self.preset, precision=self.precision, batch=batch,
                                 seed=self.seed) if isinstance(v, str) and "{runs}" in v else v
                     for k, v in self.overrides.items()}
        if self.precision == "bf16" and train_has_field("fp8"):
            overrides.setdefault("fp8", "off")
        return {"preset": self.preset, **overrides, "out_dir": str(out_dir), "run_name": self.run_id}


def train_has_field(dotted: str) -> bool:
    """Whether TrainConfig has this (dotted) field: options other engineers add appear here when they land."""
    import typing

    from redline.config import TrainConfig

    cls: Any = TrainConfig
    for part in dotted.split("."):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            return False
        cls = hints[part]
    return True


# ----------------------------------------------------------------------------------------------------
# loading


def builtin_recipes() -> dict[str, str]:
    """Name -> first line of the description, for every recipe shipped with redline."""
    out = {}
    for entry in sorted(resources.files("redline.experiments").joinpath("recipes").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            data = tomllib.loads(entry.read_text())
            out[entry.name.removesuffix(".toml")] = str(data.get("description", "")).strip().splitlines()[0]
    return out


def load_recipe(name_or_path: str) -> Recipe:
    """A built-in recipe by name, or a .toml / .yaml / .yml file."""
    path = Path(name_or_path)
    if path.suffix in (".toml", ".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise UserError(f"recipe file {name_or_path} not found; give a .toml/.yaml file or a built-in name "
                            f"({', '.join(builtin_recipes())})")
        text, source = read_text_file(path, "recipe"), str(path.resolve())
        suffix = path.suffix
    else:
        builtins = builtin_recipes()
        if name_or_path not in builtins:
            close = difflib.get_close_matches(name_or_path, builtins, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"built-in recipes: {', '.join(builtins)}"
            raise UserError(f"no recipe named {name_or_path!r} and no such file; {hint}")
        text = resources.files("redline.experiments").joinpath("recipes", f"{name_or_path}.toml").read_text()
        source, suffix = f"builtin:{name_or_path}", ".toml"
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise UserError(f"recipe {name_or_path}: use a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise UserError(f"cannot parse recipe {name_or_path}: {one_line(e)}") from None
    except Exception as e:  # yaml.YAMLError names the line
        if type(e).__module__.startswith("yaml"):
            raise UserError(f"cannot parse recipe {name_or_path}: {one_line(e)}") from None
        raise
    if not isinstance(data, dict):
        raise UserError(f"recipe {name_or_path}: the top level must be a table of keys")
    recipe = recipe_from_dict(data, default_name=path.stem if source != f"builtin:{name_or_path}" else name_or_path)
    recipe.source = source
    return recipe


def recipe_from_dict(data: dict[str, Any], default_name: str = "sweep") -> Recipe:
    where = "recipe"
    _check_keys(data, _TOP_KEYS, where)
    name = str(data.get("name", default_name))
    if not _NAME.match(name):
        raise UserError(f"recipe name {name!r}: use letters, digits and . _ + - only")
    axes = _axes(data, where, required=True)
    variants_raw = data.get("variants") or [{"name": "baseline"}]
    if not isinstance(variants_raw, list):
        raise UserError("recipe key 'variants' must be a list of tables ([[variants]] in TOML)")
    variants, seen = [], set()
    for i, raw in enumerate(variants_raw):
        if not isinstance(raw, dict) or "name" not in raw:
            raise UserError(f"recipe variants[{i}] needs a name")
        _check_keys(raw, _VARIANT_KEYS, f"variant {raw['name']!r}")
        vname = str(raw["name"])
        if not _NAME.match(vname):
            raise UserError(f"variant name {vname!r}: use letters, digits and . _ + - only (it names directories)")
        if vname in seen:
            raise UserError(f"variant {vname!r} appears twice in the recipe; names must be unique")
        seen.add(vname)
        variants.append(Variant(vname, str(raw.get("description", "")), flatten(raw.get("set") or {}, f"variant {vname!r} set"),
                                _axes(raw, f"variant {vname!r}", required=False)))
    budget = data.get("budget") or {}
    if not isinstance(budget, dict) or not budget:
        raise UserError("recipe needs a budget per run, e.g. budget = { max_steps = 200 } "
                        "(max_steps, max_tokens or max_time in minutes)")
    budget = parse_budget(budget)
    command = data.get("command") or list(DEFAULT_COMMAND)
    common = flatten(data.get("set") or {}, "recipe set")
    check_not_axes(common, "recipe set")
    for variant in variants:
        check_not_axes(variant.set, f"variant {variant.name!r} set")
    if not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
        raise UserError("recipe key 'command' must be a non-empty list of strings, e.g. [\"{python}\", \"-m\", \"redline\", \"train\"]")
    baseline = data.get("baseline")
    if baseline is None:
        baseline = {"variant": "baseline" if "baseline" in seen else variants[0].name}
    if isinstance(baseline, str):
        baseline = {"variant": baseline}
    if not isinstance(baseline, dict) or not baseline:
        raise UserError("recipe key 'baseline' must be a variant name or a table of axis values, e.g. { precision = \"bf16\" }")
    _check_keys(baseline, set(AXES), "recipe baseline")
    timeout = data.get("timeout_minutes")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise UserError(f"recipe timeout_minutes must be a positive number of minutes, got {timeout!r}")
    return Recipe(
        name=name, description=str(data.get("description", "")).strip(), presets=axes["presets"],
        precision=axes["precision"], batch=axes["batch"], seeds=axes["seeds"], budget=budget, variants=variants,
        set=common, data=(data.get("data") or None), baseline=baseline,
        keep_checkpoints=bool(data.get("keep_checkpoints", False)), timeout_minutes=timeout, command=command,
    )


def parse_budget(budget: dict[str, Any]) -> dict[str, float]:
    unknown = [k for k in budget if k not in BUDGET_KEYS]
    if unknown:
        raise UserError(f"unknown budget key {unknown[0]!r}; use max_steps, max_tokens or max_time (minutes)")
    out = {}
    for key, value in budget.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UserError(f"budget {key} must be a positive number, got {value!r}")
        out[key] = float(value) if key == "max_time" else int(value)
    return out


# TrainConfig keys that are axes of the matrix: setting them in `set` would make a run's label lie about it
AXIS_KEYS = {"batch_size": "batch", "seq_len": "batch", "seed": "seeds", "preset": "presets", "precision": "precision"}


def check_not_axes(overrides: dict[str, Any], where: str) -> None:
    for key in overrides:
        if key in AXIS_KEYS:
            raise UserError(f"{where}: {key!r} is an axis of the matrix; give it as the recipe's (or a variant's) "
                            f"`{AXIS_KEYS[key]}` list instead{' or with --seeds' if key == 'seed' else ''}")


def flatten(tree: dict[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """{"model": {"n_kv_head": 1}} and {"model.n_kv_head": 1} both become {"model.n_kv_head": 1}."""
    if not isinstance(tree, dict):
        raise UserError(f"{where} must be a table of config keys")
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, where, dotted + "."))
        else:
            out[dotted] = value
    return out


def _check_keys(data: dict, allowed: set[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(allowed))}"
            raise UserError(f"{where}: unknown key {key!r}{hint}")


def _axes(data: dict, where: str, required: bool) -> dict[str, Any]:
    """presets / precision / batch / seeds lists of a recipe (required) or of a variant (only those given)."""
    out: dict[str, Any] = {}
    if "presets" in data or required:
        out["presets"] = _str_list(data.get("presets"), "presets", where, required)
    if "precision" in data or required:
        precision = _str_list(data.get("precision", ["auto"]), "precision", where, required)
        for p in precision:
            if p not in PRECISIONS:
                close = difflib.get_close_matches(p, PRECISIONS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UserError(f"{where}: precision {p!r} is not one of {', '.join(PRECISIONS)}{hint}")
        out["precision"] = precision
    if "batch" in data:
        pairs = data["batch"]
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise UserError(f"{where}: batch must be a list of [batch_size, seq_len] pairs, e.g. [[16, 1024]]")
        out["batch"] = [(_nonneg(b, "batch_size", where), _nonneg(t, "seq_len", where)) for b, t in pairs]
    elif "batch_size" in data or "seq_len" in data or required:
        sizes = _int_list(data.get("batch_size", [0]), "batch_size", where)
        lengths = _int_list(data.get("seq_len", [0]), "seq_len", where)
        out["batch"] = [(b, t) for b in sizes for t in lengths]
    if "seeds" in data or required:
        out["seeds"] = _int_list(data.get("seeds", [1337]), "seeds", where)
    return out


def _str_list(value, key: str, where: str, required: bool) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        example = {"presets": '["tiny"]', "precision": '["bf16"]'}.get(key, '["..."]')
        raise UserError(f"{where}: {key} must be a non-empty list of names, e.g. {key} = {example}")
    return value


def _int_list(value, key: str, where: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: {key} must be a non-empty list of integers")
    return [_nonneg(v, key, where) for v in value]


def _nonneg(value, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{where}: {key} values must be integers >= 0, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------------
# expansion


def expand(recipe: Recipe, extra_set: dict[str, Any] | None = None, data: str | None = None) -> list[RunSpec]:
    """Every run of the matrix, seeds outermost. extra_set (from `--set`) wins over the recipe."""
    check_not_axes(extra_set or {}, "--set")
    data_path = data if data is not None else recipe.data
    if data_path:
        data_path = _resolve_data(data_path, recipe.source)
    runs: list[RunSpec] = []
    seen: set[str] = set()
    seeds_order = list(dict.fromkeys(recipe.seeds + [s for v in recipe.variants for s in v.axes.get("seeds", [])]))
    for seed in seeds_order:
        for variant in recipe.variants:
            if seed not in variant.axes.get("seeds", recipe.seeds):
                continue
            for preset in variant.axes.get("presets", recipe.presets):
                for precision in variant.axes.get("precision", recipe.precision):
                    for batch_size, seq_len in variant.axes.get("batch", recipe.batch):
                        overrides: dict[str, Any] = dict(SWEEP_DEFAULTS)
                        if data_path:
                            overrides["data.path"] = data_path
                        overrides.update(recipe.set)
                        overrides.update(PRECISIONS[precision])
                        if batch_size:
                            overrides["batch_size"] = batch_size
                        if seq_len:
                            overrides["seq_len"] = seq_len
                        overrides.update(recipe.budget)
                        overrides.update(variant.set)
                        overrides.update(extra_set or {})
                        overrides["seed"] = seed
                        run_id = run_name(variant.name, preset, precision, batch_size, seq_len, seed)
                        if run_id in seen:
                            raise UserError(f"recipe gives run {run_id} twice; make the variant names or axis values distinct")
                        seen.add(run_id)
                        runs.append(RunSpec(run_id, variant.name, preset, precision, batch_size, seq_len, seed, overrides))
    if not runs:
        raise UserError(f"recipe {recipe.name} expands to no runs; check its seeds and variants")
    return runs


def run_name(variant: str, preset: str, precision: str, batch_size: int, seq_len: int, seed: int) -> str:
    batch = f"{batch_size or 'd'}x{seq_len or 'd'}"
    return f"{variant}__{preset}__{precision}__{batch}__s{seed}"


def _resolve_data(path: str, source: str) -> str:
    """A data path relative to a recipe file is taken relative to that file when it exists there."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not source.startswith("builtin:") and source:
        beside = Path(source).parent / p
        if beside.exists() and not p.exists():
            p = beside
    return str(p.resolve()) if p.exists() else str(p)


def resolve_command(command: list[str]) -> list[str]:
    return [sys.executable if part == "{python}" else part for part in command]


def check_overrides(overrides: dict[str, Any], where: str) -> None:
    """Overrides every run shares must be TrainConfig keys of the right type: one typo would fail every run."""
    from redline.config import TrainConfig, apply_overrides

    try:
        apply_overrides(TrainConfig(), dict(overrides))
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def resolve_train_config(contents: dict[str, Any]):
    """The TrainConfig `redline train --config FILE` would build from these contents, or a UserError."""
    from redline.config import TrainConfig, apply_overrides, apply_preset

    cfg = TrainConfig()
    body = dict(contents)
    apply_preset(cfg, body.pop("preset", cfg.preset))
    apply_overrides(cfg, body)
    cfg.validate()
    return cfg


def describe_budget(budget: dict[str, float]) -> str:
    parts = []
    if "max_steps" in budget:
        parts.append(f"{int(budget['max_steps'])} steps")
    if "max_tokens" in budget:
        parts.append(f"{int(budget['max_tokens']):,} tokens")
    if "max_time" in budget:
        parts.append(f"{budget['max_time']:g} min")
    return " or ".join(parts)
