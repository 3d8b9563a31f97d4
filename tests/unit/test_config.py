"""Config tree: YAML recipes, dotted overrides, one-line errors naming key, value, origin and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mathrl.config import Config, ConfigError, describe_fields, dump_yaml, load_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_validate_and_auto_resolution():
    cfg = load_config()
    assert cfg.algo.name == "grpo" and cfg.advantage == "grpo" and cfg.kl_in == "loss"
    ppo = load_config(None, ["algo.name=ppo", "rollout.n=1"])
    assert ppo.advantage == "gae" and ppo.kl_in == "reward"


@pytest.mark.parametrize("recipe", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(recipe):
    from mathrl.config.rules import inert_settings

    assert inert_settings(load_config(recipe)) == []  # and sets nothing that cannot act


def test_overrides_are_coerced_by_field_type():
    cfg = load_config(None, ["algo.kl_coef=0.01", "train.lr=1e-5", "rollout.stop=[a, b]", "eval.k=1,2",
                             "algo.dual_clip=3", "algo.dual_clip=null", "train.steps=7",
                             "data.skip_bad_rows=true", "model.name=./some/dir"])
    assert cfg.algo.kl_coef == 0.01 and cfg.train.lr == 1e-5
    assert cfg.rollout.stop == ["a", "b"] and cfg.eval.k == [1, 2]
    assert cfg.algo.dual_clip is None and cfg.train.steps == 7 and cfg.data.skip_bad_rows is True


def test_yaml_then_cli_precedence(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("algo:\n  kl_coef: 0.5\ntrain:\n  lr: 1e-6\n")  # YAML 1.1 reads 1e-6 as a string
    cfg = load_config(f, ["algo.kl_coef=0.1"])
    assert cfg.algo.kl_coef == 0.1 and cfg.train.lr == 1e-6


@pytest.mark.parametrize("override, fragments", [
    ("algo.kl_cof=1", ["unknown key 'algo.kl_cof'", "did you mean 'algo.kl_coef'"]),
    ("algoo.kl_coef=1", ["unknown key 'algoo.kl_coef'", "did you mean 'algo'"]),
    ("algo.kl_coef=-1", ["algo.kl_coef = -1.0", "command line", "allowed: >= 0.0"]),
    ("algo.kl_coef=abc", ["algo.kl_coef = 'abc'", "allowed: a finite number"]),
    # non-finite numbers pass every bound and then break the run (issue 38 point 7)
    ("algo.kl_coef=inf", ["algo.kl_coef = 'inf'", "allowed: a finite number"]),
    ("rollout.temperature=inf", ["rollout.temperature = 'inf'", "allowed: a finite number"]),
    ("train.lr=-inf", ["train.lr = '-inf'", "allowed: a finite number"]),
    ("algo.clip_high=nan", ["algo.clip_high = 'nan'", "allowed: a finite number"]),
    ("rollout.backend=tpu", ["rollout.backend = 'tpu'", "one of 'auto', 'vllm', 'hf'"]),
    ("train.steps=1.5", ["train.steps = '1.5'", "an integer"]),
    ("rollout.top_p=0", ["rollout.top_p = 0.0", "> 0.0"]),
    ("algo.dual_clip=0.5", ["algo.dual_clip = 0.5", "> 1.0"]),
    ("algo.clip_low=1.5", ["algo.clip_low = 1.5", "<= 1.0"]),
    ("eval.k=1,99", ["eval.k", "k <= eval.n"]),
    ("rollout.n=1", ["rollout.n = 1", "rollout.n >= 2"]),
    ("train.mini_batch_size=3", ["train.mini_batch_size = 3", "divide"]),
    ("train.resume=/no/such/ckpt", ["train.resume", "no such checkpoint"]),
    ("kl_coef=0.1", ["unknown key 'kl_coef'"]),
    ("algo.kl_coef", ["must look like key.sub=value"]),
])
def test_bad_overrides_give_one_line_errors(override, fragments):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_micro_batch_tokens_is_auto_or_a_positive_integer(tmp_path):
    """Issue 40: train.micro_batch_tokens is 'auto' (the default) or a number (a pin); anything else is one line
    naming the key, the value, where it came from and what is allowed."""
    assert load_config().train.micro_batch_tokens == "auto"
    assert load_config(None, ["train.micro_batch_tokens=4_096"]).train.micro_batch_tokens == 4096
    assert load_config(None, ["train.micro_batch_tokens=auto"]).train.micro_batch_tokens == "auto"
    f = tmp_path / "r.yaml"
    f.write_text("train:\n  micro_batch_tokens: 2048\n")
    assert load_config(f).train.micro_batch_tokens == 2048
    f.write_text("train:\n  steps: 3\n  micro_batch_tokens: 8k\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(info.value) == (f"train.micro_batch_tokens = '8k' ({f}:3): wrong type or value; allowed: an integer "
                               "or 'auto'")
    with pytest.raises(ConfigError, match=r"train.micro_batch_tokens = 0 \(command line\): out of range; allowed: "
                                          ">= 1"):
        load_config(None, ["train.micro_batch_tokens=0"])
    for bad in ("Auto", "true", "1.5"):
        with pytest.raises(ConfigError, match="allowed: an integer or 'auto'"):
            load_config(None, [f"train.micro_batch_tokens={bad}"])


def test_yaml_errors_name_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model:\n  name: embedded\nalgo:\n  kl_coef: 0.04\n  clip_lo: 0.2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'algo.clip_lo' \(.*bad.yaml:5\).*algo.clip_low"):
        load_config(f)
    f.write_text("train:\n  steps: many\n")
    with pytest.raises(ConfigError, match=r"train.steps = 'many' \(.*bad.yaml:2\)"):
        load_config(f)
    f.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: invalid YAML"):
        load_config(f)
    f.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(f)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_every_field_is_documented_and_dump_round_trips(tmp_path):
    rows = describe_fields()
    assert len(rows) > 50
    for key, _tp, _default, doc in rows:
        assert len(doc) > 10, key
    cfg = load_config(None, ["algo.kl_coef=0.2", "eval.k=1,2"])
    f = tmp_path / "dump.yaml"
    f.write_text(dump_yaml(cfg))
    assert load_config(f) == cfg
    assert Config() == load_config()


def _mathrl(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "mathrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.slow
def test_cli_train_help_lists_fields_and_errors_have_no_traceback():
    out = _mathrl("train", "--help")
    assert out.returncode == 0
    assert "algo.kl_coef = 0.04" in out.stdout and "rollout.n = 8" in out.stdout
    bad = _mathrl("train", "configs/demo.yaml", "algo.kl_coef=-2")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "mathrl train: error: algo.kl_coef = -2.0 (command line): out of range; allowed: >= 0.0"]
    ok = _mathrl("train", "configs/demo.yaml", "algo.kl_coef=0.1", "--print-config")
    assert ok.returncode == 0 and "kl_coef: 0.1" in ok.stdout
    top = _mathrl("--help")
    assert top.returncode == 0 and "train" in top.stdout and "verify" in top.stdout
    unknown = _mathrl("fly")
    assert unknown.returncode == 2 and "unknown command 'fly'" in unknown.stderr


def test_iterative_rl_needs_a_kl_term():
    assert load_config(None, ["algo.ref_update_every=2"]).algo.ref_update_every == 2
    with pytest.raises(ConfigError, match="algo.ref_update_every = 2: resetting the reference model only matters"):
        load_config(None, ["algo.kl_coef=0", "algo.ref_update_every=2"])


def test_kl_placement_and_estimator_defaults_follow_the_papers():
    from mathrl.config import ConfigError

    grpo = load_config(None, [])
    assert (grpo.kl_in, grpo.kl_estimator) == ("loss", "k3")             # DeepSeekMath eq. 4
    ppo = load_config(None, ["algo.name=ppo"])
    assert (ppo.kl_in, ppo.kl_estimator) == ("reward", "k1")             # InstructGPT / PPO
    rpp = load_config(None, ["algo.advantage=reinforce_pp"])
    assert (rpp.kl_in, rpp.kl_estimator) == ("reward", "k1")             # REINFORCE++
    rloo = load_config(None, ["algo.name=ppo", "algo.advantage=rloo"])
    assert (rloo.kl_in, rloo.kl_estimator) == ("loss", "k3")
    with pytest.raises(ConfigError, match="k1.*zero expected gradient"):
        load_config(None, ["algo.kl_estimator=k1"])
    assert load_config(None, ["algo.kl_estimator=k1", "algo.kl_in=reward"]).kl_in == "reward"
    assert load_config(None, ["algo.kl_estimator=k1", "algo.kl_coef=0"]).algo.kl_coef == 0  # no KL term at all


def test_value_clip_zero_means_no_clipping():
    cfg = load_config(None, ["algo.name=ppo", "algo.value_clip=0"])
    assert cfg.algo.value_clip == 0.0


def test_every_documented_field_is_read_by_the_code():
    """--help must not document what does nothing: each field is read outside the config package
    (as ``<section>.<field>`` on a config, e.g. ``cfg.data.shuffle`` or ``d.shuffle``, or as a parameter
    an advantage estimator declares, which :func:`estimator_params` reads from ``cfg.algo``)."""
    import re

    from mathrl.algo.advantages import ESTIMATORS

    root = Path(__file__).resolve().parents[2] / "mathrl"
    code = "\n".join(p.read_text() for p in root.rglob("*.py") if "config" not in p.relative_to(root).parts
                     and p.name != "config.py")
    declared = {f"algo.{p}" for s in ESTIMATORS.values() for p in s.params}
    unread = [key for key, *_ in describe_fields()
              if key not in declared and not re.search(r"\.%s\b" % re.escape(key.split(".")[1]), code)]
    assert not unread, f"config fields never read by mathrl: {unread}"


@pytest.mark.parametrize("text, fragments", [
    ("algo:\n  kl_coef: !!python/object/apply:os.system [echo hi]\n",
     ["r.yaml:2: algo.kl_coef:", "tag:yaml.org,2002:python/object/apply:os.system", "no YAML tags"]),
    ("model:\n  name: !foo embedded\n", ["r.yaml:2: model.name:", "'!foo'", "no YAML tags"]),
    ("algo:\n  kl_coef: 0.1\n  clip_low: 0.2\n  kl_coef: 0.5\n",
     ["r.yaml:4: 'algo.kl_coef' appears twice (first at line 2)"]),
    ("algo:\n  kl_coef: 0.1\ntrain:\n  lr: 1e-6\nalgo:\n  clip_low: 0.2\n",
     ["r.yaml:5: 'algo' appears twice (first at line 1)"]),
])
def test_yaml_tags_and_duplicate_keys_are_one_line_errors(tmp_path, text, fragments):
    """Issue 38 point 8: a tag gave a raw yaml.constructor.ConstructorError traceback; duplicate keys and
    sections were merged silently, the last one winning."""
    f = tmp_path / "r.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    msg = str(info.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
