"""Platform config: YAML -> typed, validated objects (see schema.py for every key)."""

from lattice.config.loader import ConfigError, Problem, load_config, parse_config
from lattice.config.schema import PlatformConfig

__all__ = ["ConfigError", "PlatformConfig", "Problem", "load_config", "parse_config"]
