"""Ablation studies: the YAML format, grid expansion and per-run configs.

A study file (``configs/ablations/<study>.yaml``)::

    study:
      name: cpu_demo
      out: runs/ablations/cpu_demo     # study folder (relative to the current directory)
      base: ../demo.yaml               # optional recipe the base starts from (relative to this file)
      curve_every: 0                   # also evaluate checkpoints every N steps (0 = before/after only)
      launcher: mathrl ablate          # command prefix printed by --print-commands
      rft: {dedup: true, max_per_problem: null}   # RFT data filter (per run: `rft:` in the run)
      seeds: [0, 1]                    # every run once per seed (train.seed), named <run>-seed<k>
                                       # (a run's own `seeds:` replaces it for that run)
      compare: [[rft, online_rft], [online_rft, grpo]]   # exploratory paired comparisons "B vs A"
      primary_metric: greedy           # the confirmatory metric: greedy, pass@k (pass@1 needs eval.n >= 8), maj@k
      contrasts: [[before, grpo], [rft, grpo]]   # the declared family "B vs A" on primary_metric
                                       # (A = before: B against the initial model); Holm-corrected
    base:                              # config sections, as in a recipe; applied after study.base
      train: {steps: 10, batch_size: 4}
    runs:
      - {method: rft, overrides: {train.lr: 1.0e-5}}           # name defaults to the method
      - {method: online_rft, overrides: {train.lr: 1.0e-5}}
      - {method: grpo}
      - {method: grpo, variant: dr_grpo, seeds: [0]}             # name: grpo-dr_grpo(-seed0)
      - {method: grpo, sweep: {rollout.n: [4, 8, 16]}}           # grpo-n4, grpo-n8, grpo-n16
      - {method: ppo, name: ppo}

A run's config = defaults <- ``study.base`` recipe <- ``base`` <- the method's preset <- the
variants' presets <- the run's ``overrides`` <- the sweep point; then ``train.output_dir`` is set to
``<study out>/<run name>``. With ``study.seeds`` each run is repeated per seed; the report averages a
run's seeds (its *group*, the name without ``-seed<k>``) per held-out problem and compares every group
with the initial model and the pairs of ``study.compare`` by a paired bootstrap over problems
(:mod:`mathrl.ablate.compare`). Those rows are exploratory (uncorrected). ``study.primary_metric`` and
``study.contrasts``, declared together and before the runs, make the confirmatory family: one test per
contrast on the primary metric, Holm-corrected over the family. Override keys are dotted
(``algo.kl_coef``) or nested mappings. Every key and value is checked by :mod:`mathrl.config`; errors
name the study file, the run and the key.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mathrl.config import Config, ConfigError, set_value, validate
from mathrl.config.loader import flatten_yaml
from mathrl.registry import ABLATION_METHODS, ESTIMATORS

__all__ = ["BEFORE", "DONE", "HELDOUT_EVAL", "HELDOUT_LABELS", "MIN_PASS1_SAMPLES", "PRM_DEFAULTS", "PRM_FOLDER", "TRAINED", "VARIANTS", "RunSpec", "Study",
           "dump_study", "load_study", "run_config"]

# the files that mark a run of a study as done (written last) and as trained (evaluation pending)
DONE = "DONE.json"
TRAINED = "trained.json"

VARIANTS: dict[str, dict[str, Any]] = {
    # Dr. GRPO (Liu et al. 2025): no std normalisation, constant length normaliser
    "dr_grpo": {"algo.advantage": "dr_grpo", "algo.loss_agg": "seq-mean-token-sum-norm"},
    "no_kl": {"algo.kl_coef": 0.0},
    "kl0.04": {"algo.kl_coef": 0.04},
    "k1": {"algo.kl_estimator": "k1", "algo.kl_in": "reward"},  # k1 only works as a reward penalty
    "k3": {"algo.kl_estimator": "k3"},
    "clip_higher": {"algo.clip_low": 0.2, "algo.clip_high": 0.28},   # DAPO
    "dynamic_sampling": {"algo.dynamic_sampling": True},              # DAPO: resample all-equal groups
    "token_mean": {"algo.loss_agg": "token-mean"},
    "seq_mean_token_mean": {"algo.loss_agg": "seq-mean-token-mean"},
    "seq_mean_token_sum": {"algo.loss_agg": "seq-mean-token-sum"},
    "seq_mean_token_sum_norm": {"algo.loss_agg": "seq-mean-token-sum-norm"},
}
"""Named override bundles for the commonly argued-about ablations (``variant:`` in a run)."""

STUDY_KEYS = {"name", "out", "base", "curve_every", "launcher", "rft", "description", "seeds", "compare",
              "primary_metric", "contrasts", "prm"}
RUN_KEYS = {"name", "method", "variant", "overrides", "sweep", "rft", "group", "seeds"}
RFT_KEYS = {"dedup", "max_per_problem"}
PRM_DEFAULTS: dict[str, Any] = {"problems": 64, "k": 4, "epochs": 2, "lr": 1e-5, "batch": 16, "heldout": 0}
"""``study.prm``: the initial PRM the study trains for its process-supervised rows (grpo_ps) that give no
``model.prm``: the initial policy's samples (``rollout.n`` each) of the first ``problems`` training problems,
every step labelled from ``k`` completions, then ``epochs`` passes at ``lr``, ``batch`` responses per step; with
``heldout`` = N > 0 it is then measured on the first N held-out problems, labelled the same way."""
PRM_FOLDER = "prm_initial"
"""Where in the study's folder that PRM (and its ``labels.jsonl``) is kept."""
HELDOUT_LABELS = "heldout_labels.jsonl"
HELDOUT_EVAL = "heldout_eval.json"
"""In the PRM's folder: the labelled held-out responses and the PRM's figures on them (``study.prm.heldout``)."""
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")
_METRIC_RE = re.compile(r"^(greedy|pass@[1-9][0-9]*|maj@[1-9][0-9]*)$")
BEFORE = "before"
"""The name of the initial model in ``study.contrasts`` (reserved: no run may be called so)."""
MIN_PASS1_SAMPLES = 8
"""pass@1 as a primary metric needs at least this many samples per problem (``eval.n``)."""


@dataclass
class RunSpec:
    """One run of a study after grid expansion."""

    name: str
    method: str
    overrides: list[tuple[str, Any, str]]   # (dotted key, value, origin for error messages)
    rft: dict[str, Any] = field(default_factory=dict)
    group: str = ""                          # the run without its seed (= name when study.seeds is unset)

    def __post_init__(self) -> None:
        self.group = self.group or self.name

    def override_dict(self) -> dict[str, Any]:
        return {k: v for k, v, _ in self.overrides}


@dataclass
class Study:
    path: Path
    name: str
    out: Path
    base_recipe: Path | None
    base: list[tuple[str, Any, str]]
    runs: list[RunSpec]
    curve_every: int = 0
    launcher: str = "mathrl ablate"
    description: str = ""
    compare: list[tuple[str, str]] = field(default_factory=list)   # (A, B) group pairs: "B vs A"
    primary_metric: str = ""                                         # the confirmatory metric ("" = none)
    contrasts: list[tuple[str, str]] = field(default_factory=list)  # the declared family; A may be "before"
    cli_overrides: list[str] = field(default_factory=list)          # key=value from the command line
    prm: dict[str, Any] = field(default_factory=dict)                # study.prm (PRM_DEFAULTS filled in), or {}

    def run(self, name: str) -> RunSpec:
        for r in self.runs:
            if r.name == name:
                return r
        raise ConfigError(f"{self.path}: no run named {name!r}; runs: {', '.join(r.name for r in self.runs)}")


def _flatten(mapping: Any, where: str, prefix: str = "") -> list[tuple[str, Any]]:
    """``{algo: {kl_coef: 0}}`` or ``{algo.kl_coef: 0}`` -> ``[("algo.kl_coef", 0)]``."""
    if mapping is None:
        return []
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: expected a mapping of config keys (e.g. algo.kl_coef: 0), got {mapping!r}")
    out = []
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(_flatten(v, where, key + "."))
        else:
            out.append((key, v))
    return out


def _line_of(root: yaml.Node | None, *path: Any) -> str:
    """``:line`` of a node in the composed YAML (best effort, for error messages)."""
    node = root
    mark = None
    try:
        for p in path:
            if isinstance(node, yaml.MappingNode):
                key, node = next((k, v) for k, v in node.value if k.value == p)
                mark = key.start_mark  # a key's own line, not its value's
            elif isinstance(node, yaml.SequenceNode):
                node = node.value[p]
                mark = node.start_mark
            else:
                return ""
        return f":{mark.line + 1}" if mark is not None else ""
    except (StopIteration, IndexError, TypeError):
        return ""


def _slug(value: Any) -> str:
    s = str(value).lower() if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", s)


def _check_rft(opts: Any, where: str) -> dict[str, Any]:
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{where}: 'rft' must be a mapping with keys {', '.join(sorted(RFT_KEYS))}")
    bad = set(opts) - RFT_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown rft option(s) {', '.join(sorted(bad))}; allowed: "
                          f"{', '.join(sorted(RFT_KEYS))}")
    if "dedup" in opts and not isinstance(opts["dedup"], bool):
        raise ConfigError(f"{where}: rft.dedup = {opts['dedup']!r}; allowed: true/false")
    mpp = opts.get("max_per_problem")
    if mpp is not None and (isinstance(mpp, bool) or not isinstance(mpp, int) or mpp < 1):
        raise ConfigError(f"{where}: rft.max_per_problem = {mpp!r}; allowed: an integer >= 1 or null")
    return dict(opts)


def _check_prm(opts: Any, where: str) -> dict[str, Any]:
    if opts is None:
        return {}
    if not isinstance(opts, dict) or set(opts) - set(PRM_DEFAULTS):
        raise ConfigError(f"{where}: study.prm must be a mapping with keys among {', '.join(PRM_DEFAULTS)}; got "
                          f"{opts!r:.80}")
    out = {**PRM_DEFAULTS, **opts}
    for key in ("problems", "k", "epochs", "batch", "heldout"):
        low = 0 if key == "heldout" else 1
        if isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < low:
            raise ConfigError(f"{where}: study.prm.{key} = {out[key]!r}; allowed: an integer >= {low}")
    if isinstance(out["lr"], bool) or not isinstance(out["lr"], (int, float)) or not out["lr"] > 0:
        raise ConfigError(f"{where}: study.prm.lr = {out['lr']!r}; allowed: a number > 0")
    return out


def _check_seeds(seeds: Any, where: str, key: str = "study.seeds") -> list[int] | None:
    if seeds is None:
        return None
    if not isinstance(seeds, list) or not seeds or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: {key} = {seeds!r}; allowed: a non-empty list of distinct integers, "
                          "e.g. [0, 1]")
    return list(seeds)


def _check_compare(pairs: Any, groups: set[str], where: str) -> list[tuple[str, str]]:
    if pairs is None:
        return []
    ok = isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs)
    if not ok:
        raise ConfigError(f"{where}: study.compare = {pairs!r}; allowed: a list of [A, B] run pairs, e.g. "
                          "[[rft, online_rft], [online_rft, grpo]] (B is compared with A)")
    for a, b in pairs:
        for g in (a, b):
            if g not in groups:
                raise ConfigError(f"{where}: study.compare names {g!r}, which is not a run of this study; runs "
                                  f"(without their seed): {', '.join(sorted(groups))}")
    return [(str(a), str(b)) for a, b in pairs]


def _check_contrasts(pairs: Any, groups: set[str], where: str) -> list[tuple[str, str]]:
    ok = isinstance(pairs, list) and pairs and all(isinstance(p, list) and len(p) == 2 for p in pairs)
    if not ok:
        raise ConfigError(f"{where}: study.contrasts = {pairs!r}; allowed: a non-empty list of [A, B] pairs, e.g. "
                          f"[[{BEFORE}, grpo], [rft, grpo]] (B is compared with A on study.primary_metric; "
                          f"A = {BEFORE}: the initial model)")
    out: list[tuple[str, str]] = []
    for a, b in pairs:
        a, b = str(a), str(b)
        for g in (a, b):
            if g not in groups and not (g == BEFORE and g == a):
                raise ConfigError(f"{where}: study.contrasts names {g!r}, which is not a run of this study"
                                  f"{' (before is allowed as A only)' if g == BEFORE else ''}; runs (without their "
                                  f"seed): {', '.join(sorted(groups))}")
        if a == b or (a, b) in out:
            raise ConfigError(f"{where}: study.contrasts: [{a}, {b}] " + ("compares a run with itself" if a == b
                              else "is declared twice"))
        out.append((a, b))
    return out


def _check_primary(study: Study, configs: list[Config], where: str) -> None:
    """``primary_metric`` is computed by every run's evaluation; pass@1 needs ``eval.n >= 8`` samples."""
    m = study.primary_metric
    if not _METRIC_RE.match(m):
        raise ConfigError(f"{where}: study.primary_metric = {m!r}; allowed: greedy, pass@k or maj@k (k >= 1)")
    for r, cfg in zip(study.runs, configs):
        ev = cfg.eval
        if m == "greedy" and not ev.greedy:
            raise ConfigError(f"{where}: study.primary_metric = greedy, but run {r.name!r} has eval.greedy = false")
        k = int(m.split("@")[1]) if "@" in m else 1
        if k > ev.n:
            raise ConfigError(f"{where}: study.primary_metric = {m}, but run {r.name!r} draws eval.n = {ev.n} "
                              "samples per problem")
        if m == "pass@1" and ev.n < MIN_PASS1_SAMPLES:
            raise ConfigError(f"{where}: study.primary_metric = pass@1 needs eval.n >= {MIN_PASS1_SAMPLES} samples "
                              f"per problem; run {r.name!r} has eval.n = {ev.n} (raise eval.n, or use greedy)")


def load_study(path: str | Path, out: str | Path | None = None, overrides: list[str] | None = None) -> Study:
    """Parse and expand a study file; every run's config is built (validated) before anything runs.

    ``overrides``: ``key=value`` items (``mathrl ablate STUDY data.path=...``) applied to the base of every
    run, after the study's ``base`` (a run's own overrides still win)."""
    path = Path(path)
    overrides = list(overrides or [])
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} (command line) must look like key.sub=value, "
                              "e.g. data.path=/data/asdiv/test.jsonl")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read study file {path}: {exc.strerror}") from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"{path}{f':{mark.line + 1}' if mark else ''}: invalid YAML: "
                          f"{getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with 'study', 'base' and 'runs'")
    unknown = set(data) - {"study", "base", "runs"}
    if unknown:
        k = sorted(unknown)[0]
        raise ConfigError(f"{path}{_line_of(root, k)}: unknown top-level key {k!r}; allowed: study, base, runs")
    st = data.get("study") or {}
    if not isinstance(st, dict):
        raise ConfigError(f"{path}{_line_of(root, 'study')}: 'study' must be a mapping")
    bad = set(st) - STUDY_KEYS
    if bad:
        k = sorted(bad)[0]
        raise ConfigError(f"{path}{_line_of(root, 'study', k)}: unknown study option {k!r}; allowed: "
                          f"{', '.join(sorted(STUDY_KEYS))}")
    name = str(st.get("name") or path.stem)
    out_dir = Path(out) if out is not None else Path(st.get("out") or f"runs/ablations/{name}")
    base_recipe = None
    if st.get("base"):
        base_recipe = (path.parent / str(st["base"])).resolve()
        if not base_recipe.is_file():
            raise ConfigError(f"{path}{_line_of(root, 'study', 'base')}: study.base = {st['base']!r}: "
                              f"no such file ({base_recipe})")
    curve_every = st.get("curve_every", 0)
    if isinstance(curve_every, bool) or not isinstance(curve_every, int) or curve_every < 0:
        raise ConfigError(f"{path}{_line_of(root, 'study', 'curve_every')}: study.curve_every = {curve_every!r}; "
                          "allowed: an integer >= 0")
    study_rft = _check_rft(st.get("rft"), f"{path}{_line_of(root, 'study', 'rft')}")
    base = [(k, v, f"{path}{_line_of(root, 'base', *k.split('.'))}")
            for k, v in _flatten(data.get("base"), f"{path}{_line_of(root, 'base')}")]
    runs_raw = data.get("runs")
    if not isinstance(runs_raw, list) or not runs_raw:
        raise ConfigError(f"{path}{_line_of(root, 'runs')}: 'runs' must be a non-empty list of "
                          "{method: ..., name: ..., variant: ..., overrides: {...}, sweep: {...}}")
    seeds = _check_seeds(st.get("seeds"), f"{path}{_line_of(root, 'study', 'seeds')}")
    runs: list[RunSpec] = []
    for i, r in enumerate(runs_raw):
        where = f"{path}{_line_of(root, 'runs', i)}"
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: run #{i + 1} must be a mapping with at least 'method'")
        bad = set(r) - RUN_KEYS
        if bad:
            raise ConfigError(f"{where}: run #{i + 1}: unknown key(s) {', '.join(sorted(bad))}; allowed: "
                              f"{', '.join(sorted(RUN_KEYS))}")
        run_seeds = _check_seeds(r["seeds"], f"{where}: run #{i + 1}", "seeds") if "seeds" in r else seeds
        method = r.get("method")
        if method not in ABLATION_METHODS:
            raise ConfigError(f"{where}: run #{i + 1}: method = {method!r}; allowed: {', '.join(ABLATION_METHODS)}")
        variants = r.get("variant") or []
        variants = [variants] if isinstance(variants, str) else list(variants)
        for v in variants:
            if v not in VARIANTS:
                raise ConfigError(f"{where}: run #{i + 1}: variant = {v!r}; allowed: {', '.join(VARIANTS)}")
        ovr = [(k, v, f"{where} (run #{i + 1} overrides)") for k, v in _flatten(r.get("overrides"), where)]
        pre = [(k, v, f"method {method!r}") for k, v in ABLATION_METHODS.meta(method)["presets"].items()]
        for vname in variants:
            pre += [(k, v, f"variant {vname!r}") for k, v in VARIANTS[vname].items()]
        rft_opts = {**study_rft, **_check_rft(r.get("rft"), where)}
        sweep = r.get("sweep") or {}
        points: list[list[tuple[str, Any]]] = [[]]
        if sweep:
            flat = _flatten(sweep, where)
            for k, vals in flat:
                if not isinstance(vals, list) or not vals:
                    raise ConfigError(f"{where}: run #{i + 1}: sweep.{k} must be a non-empty list of values")
            points = [list(zip([k for k, _ in flat], combo)) for combo in itertools.product(*[v for _, v in flat])]
        for point in points:
            default = "-".join([method, *variants] + [f"{k.split('.')[-1]}{_slug(v)}" for k, v in point])
            template = r.get("name")
            if template is None:
                run_name = default
            else:
                run_name = str(template)
                if point and "{" not in run_name:
                    run_name += "-" + "-".join(f"{k.split('.')[-1]}{_slug(v)}" for k, v in point)
                for k, v in point:
                    run_name = run_name.replace("{" + k + "}", _slug(v))
            if not _NAME_RE.match(run_name) or run_name in ("baseline", BEFORE):
                raise ConfigError(f"{where}: run name {run_name!r}: use letters, digits and . _ + = - (it is a "
                                  f"folder name; 'baseline' and '{BEFORE}' are reserved)")
            spec = pre + ovr + [(k, v, f"{where} (sweep)") for k, v in point]
            if run_seeds is None:  # a dumped study names each run's group itself
                runs.append(RunSpec(run_name, method, spec, rft_opts, group=str(r.get("group") or "")))
            seed_where = f"{where} (seeds)" if "seeds" in r else f"{path}{_line_of(root, 'study', 'seeds')}"
            for seed in run_seeds or ():
                runs.append(RunSpec(f"{run_name}-seed{seed}", method, spec + [("train.seed", seed, seed_where)],
                                    rft_opts, group=run_name))
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{path}: run name(s) {', '.join(dup)} occur more than once; give runs distinct 'name's")
    launcher = str(st.get("launcher") or "mathrl ablate")
    compare = _check_compare(st.get("compare"), {r.group for r in runs}, f"{path}{_line_of(root, 'study', 'compare')}")
    groups = {r.group for r in runs}
    primary, contrasts = st.get("primary_metric"), st.get("contrasts")
    if (primary is None) != (contrasts is None):
        k = "contrasts" if primary is not None else "primary_metric"
        raise ConfigError(f"{path}{_line_of(root, 'study', 'primary_metric' if primary is not None else 'contrasts')}"
                          f": study.primary_metric and study.contrasts are declared together (study.{k} is missing)")
    study = Study(path=path, name=name, out=out_dir, base_recipe=base_recipe, base=base, runs=runs,
                  curve_every=curve_every, launcher=launcher, description=str(st.get("description") or ""),
                  compare=compare, cli_overrides=overrides, primary_metric="" if primary is None else str(primary),
                  contrasts=[] if contrasts is None else
                  _check_contrasts(contrasts, groups, f"{path}{_line_of(root, 'study', 'contrasts')}"),
                  prm=_check_prm(st.get("prm"), f"{path}{_line_of(root, 'study', 'prm')}"))
    _pin_heldout_seed(study)
    configs = [run_config(study, r) for r in runs]  # fail before any work
    if primary is not None:
        _check_primary(study, configs, f"{path}{_line_of(root, 'study', 'primary_metric')}")
    return study


def _pin_heldout_seed(study: Study) -> None:
    """A generated held-out set is drawn with ``train.seed`` unless ``data.eval_seed`` is set, so the seeds of a
    study would be evaluated on different problems (other wordings, other ids) and no run could be paired with
    another seed's run or baseline. Unless the study sets ``data.eval_seed`` itself (base, base recipe or command
    line), every run gets ``data.eval_seed`` = the smallest ``train.seed`` of the study's runs, first among its
    overrides; a run that sets it itself (its own setting, or a study written by :func:`dump_study`) keeps it."""
    cfg = base_config(study)
    seeds = sorted({v for r in study.runs for k, v, _ in r.overrides if k == "train.seed"})
    if cfg.data.eval_seed is not None or len(seeds) < 2:
        return
    from mathrl.data.splits import generated_heldout_source

    if generated_heldout_source(cfg) is None:
        return
    origin = f"{study.path} (study.seeds: one generated held-out set for every seed)"
    for r in study.runs:
        if not any(k == "data.eval_seed" for k, _, _ in r.overrides):
            r.overrides.insert(0, ("data.eval_seed", seeds[0], origin))


def dump_study(study: Study, path: str | Path) -> Path:
    """Write ``study`` (possibly edited in Python) as an equivalent study file with its runs expanded."""
    data = {"study": {"name": study.name, "out": str(Path(study.out).resolve()), "curve_every": study.curve_every,
                      "launcher": study.launcher, "description": study.description},
            "base": {k: v for k, v, _ in study.base},  # (command-line overrides are not written: pass them again)
            "runs": [{"name": r.name, "method": r.method, "overrides": {k: v for k, v, _ in r.overrides},
                      "rft": dict(r.rft), **({"group": r.group} if r.group != r.name else {})}
                     for r in study.runs]}
    if study.compare:
        data["study"]["compare"] = [list(p) for p in study.compare]
    if study.primary_metric:
        data["study"]["primary_metric"] = study.primary_metric
        data["study"]["contrasts"] = [list(p) for p in study.contrasts]
    if study.prm:
        data["study"]["prm"] = dict(study.prm)
    if study.base_recipe is not None:
        data["study"]["base"] = str(Path(study.base_recipe).resolve())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def base_config(study: Study) -> Config:
    """The study's base config (defaults <- study.base recipe <- base)."""
    cfg = Config()
    if study.base_recipe is not None:
        for key, value, line in flatten_yaml(study.base_recipe):
            set_value(cfg, key, value, origin=f"{study.base_recipe}:{line}")
    for key, value, origin in study.base:
        set_value(cfg, key, value, origin=origin)
    for item in study.cli_overrides:
        key, value = item.split("=", 1)
        set_value(cfg, key.strip(), value, origin="command line", from_cli=True)
    return cfg


def run_config(study: Study, run: RunSpec) -> Config:
    """The validated config of one run, with ``train.output_dir = <study out>/<run name>``."""
    cfg = base_config(study)
    for key, value, origin in run.overrides:
        set_value(cfg, key, value, origin=f"{origin}, run {run.name!r}")
    cfg.train.output_dir = str(study.out / run.name)
    if study.prm and cfg.model.prm is None and ESTIMATORS[cfg.advantage].level == "step":
        cfg.model.prm = str(study.out / PRM_FOLDER)  # trained by the driver before the run (study.prm)
    if study.curve_every:
        cfg.train.save_every = study.curve_every
        cfg.train.keep_last = max(cfg.train.keep_last, cfg.train.steps // study.curve_every + 1)
    try:
        validate(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{study.path}, run {run.name!r}: {exc}") from None
    return cfg
