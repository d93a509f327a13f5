"""The recipes: ml_collections `get_config(arg)` files installed with the package.

Every command's `--config` takes a recipe by name, `NAME[:ARG]`, from any directory:

  pretrain:tiny | mini | small | base | large | transfer | demo   (bert_jax/configs/pretrain.py)
  squad[:tiny | base | large]                                    (bert_jax/configs/squad.py)
  glue:cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli (bert_jax/configs/glue.py)
  ner[:ARG], swag[:ARG]                                          (bert_jax/configs/ner.py, swag.py)

or a config file of the user's own by path (`path/to/my_config.py:arg`, ml_collections' form); either
way `--config.x.y=value` overrides a field.
"""

from __future__ import annotations

import os

NAMES = ("pretrain", "squad", "glue", "ner", "swag")
_HERE = os.path.dirname(os.path.abspath(__file__))


def resolve(spec: str) -> str:
    """`NAME[:ARG]` of a packaged recipe -> `<package>/configs/NAME.py[:ARG]`; anything else (a path to a
    config file, with or without `:ARG`) unchanged.

    A name wins over a file of the same name in the working directory only when that file does not exist
    (`pretrain` is the recipe unless `./pretrain` exists).
    """
    name, sep, arg = spec.partition(":")
    if name in NAMES and not os.path.exists(name):
        return os.path.join(_HERE, f"{name}.py") + sep + arg
    return spec


def mark_explicit_model_fields(config):
    """`config` with `explicit_model_fields`: the names of the `--config.model.<field>=` overrides given on the
    command line (after absl parsed `--config`), so that a job starting from an init_checkpoint can tell a
    field set by hand (which must agree with the checkpoint's architecture) from the recipe's default."""
    from absl import flags
    from ml_collections import config_flags

    names = sorted(k.split(".", 1)[1] for k in config_flags.get_override_values(flags.FLAGS["config"])
                   if k.startswith("model."))
    if names:
        with config.unlocked():
            config.explicit_model_fields = names
    return config


def define_flag(help_string: str):
    """Defines `--config` (ml_collections' config-file flag, `--config.x.y=value` overrides) taking a recipe
    name (`resolve`) or a config file path -> the flag holder.

    A recipe or file that cannot be loaded (no such file, an unknown recipe argument, any error of its
    `get_config`) ends the command with one line `--config=<value>: <the error's message>` (SystemExit,
    exit status 1), not absl's flag error with the traceback ml_collections puts in it.
    """
    from absl import flags
    from ml_collections import config_flags
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser

    class _RecipeParser(ConfigFileFlagParser):
        def parse(self, path):
            resolved = resolve(path)
            if not os.path.isfile(resolved.split(":", 1)[0]):
                raise SystemExit(f"--config={path}: no such recipe or config file (recipes: {', '.join(NAMES)})")
            try:
                return super().parse(resolved)
            except Exception as e:  # noqa: BLE001  ml_collections re-raises with the traceback as the message
                lines = [line for line in str(e).splitlines() if line.strip()]
                raise SystemExit(f"--config={path}: {lines[-1].strip() if lines else type(e).__name__}") from None

    holder = config_flags.DEFINE_config_file("config", None, help_string)
    flags.FLAGS["config"].parser = _RecipeParser(name="config")
    return holder
