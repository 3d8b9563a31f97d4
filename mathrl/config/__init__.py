"""The typed configuration tree: dataclasses, YAML recipes, dotted CLI overrides.

One tree (:class:`Config`) covers every stage of the pipeline. Every field is declared with
:func:`option`, which records its meaning, the reason for its default and its allowed values;
``mathrl train --help`` prints them.

Sources, applied in order: the dataclass defaults, a YAML recipe (``configs/*.yaml``), then
``key.sub=value`` overrides from the command line. Unknown keys, wrong types and out-of-range values
raise :class:`ConfigError` whose one-line message names the key, the value, where it came from (file and
line, or the command line) and what is allowed. Validation happens before any work starts.

Modules: :mod:`mathrl.config.schema` (the dataclasses and :func:`option`),
:mod:`mathrl.config.loader` (YAML and override parsing, validation) and :mod:`mathrl.config.help` (the
help text). The package is a leaf: the names a field allows come from :mod:`mathrl.registry`, which
imports the modules that register them by name, so nothing here imports another part of mathrl. The names below are the
public API; import them from ``mathrl.config``.
"""

from mathrl.config.help import describe_fields, help_text
from mathrl.config import rules
from mathrl.config.loader import ConfigError, dump_yaml, load_config, set_value, validate
from mathrl.config.schema import (
    AlgoConfig,
    Config,
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    option,
)

__all__ = [
    "Config",
    "ConfigError",
    "load_config",
    "set_value",
    "validate",
    "rules",
    "describe_fields",
    "help_text",
    "dump_yaml",
    "option",
    "ModelConfig",
    "DataConfig",
    "RolloutConfig",
    "RewardConfig",
    "AlgoConfig",
    "TrainConfig",
    "DeepSpeedConfig",
    "LoggingConfig",
    "EvalConfig",
]
