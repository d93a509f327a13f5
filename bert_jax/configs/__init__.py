"""The recipes: ml_collections `get_config(arg)` files installed with the package.

Every command's `--config` takes a recipe by name, `NAME[:ARG]`, from any directory:

  pretrain:tiny | mini | small | base | large | transfer | demo   (bert_jax/configs/pretrain.py)
  squad[:tiny | base | large]                                    (bert_jax/configs/squad.py)
  glue:cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli (bert_jax/configs/glue.py)
  ner[:ARG], swag[:ARG]                                          (bert_jax/configs/ner.py, swag.py)

or a config file of the user's own by path (`path/to/my_config.py:arg`, ml_collections' form; in the
working directory `./NAME`); either way `--config.x.y=value` overrides a field. A recipe name that is also a
file or directory in the working directory (a data folder `squad`) is an error saying how to write each.
"""

from __future__ import annotations

import os

NAMES = ("pretrain", "squad", "glue", "ner", "swag")
_HERE = os.path.dirname(os.path.abspath(__file__))


def resolve(spec: str) -> str:
    """`NAME[:ARG]` of a packaged recipe -> `<package>/configs/NAME.py[:ARG]`; anything else (a path to a
    config file, with or without `:ARG`) unchanged.

    A recipe name always means the recipe and a path of the user's is written as a path (`./squad`,
    `configs/my.py`): a bare recipe name that is also a file or directory in the working directory (a data
    folder `squad`) is neither silently, but an error.

    Raises:
      ValueError: such a clash (one line: which is which, and how to write each).
    """
    name, sep, arg = spec.partition(":")
    if name not in NAMES:
        return spec
    recipe = os.path.join(_HERE, f"{name}.py")
    if os.path.lexists(name):
        kind = "directory" if os.path.isdir(name) else "file"
        raise ValueError(f"{name!r} is both the recipe {name} and the {kind} ./{name} in the working directory: "
                         f"write --config={recipe}{sep}{arg} for the recipe (or run from another directory), "
                         f"--config=./{name}{sep}{arg} for the {kind}")
    return recipe + sep + arg


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

    A recipe or file that cannot be loaded (no such file, a directory, a recipe name that is also a path in
    the working directory, an unknown recipe argument, any error of its `get_config`) ends the command with
    one line `--config=<value>: <the error's message>` (SystemExit, exit status 1), not absl's flag error
    with the traceback ml_collections puts in it.
    """
    from absl import flags
    from ml_collections import config_flags
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser

    class _RecipeParser(ConfigFileFlagParser):
        def parse(self, path):
            try:
                resolved = resolve(path)
            except ValueError as e:
                raise SystemExit(f"--config={path}: {e}") from None
            file = resolved.split(":", 1)[0]
            if os.path.isdir(file):
                raise SystemExit(f"--config={path}: a directory, not a config file (recipes: {', '.join(NAMES)})")
            if not os.path.isfile(file):
                raise SystemExit(f"--config={path}: no such recipe or config file (recipes: {', '.join(NAMES)})")
            try:
                return super().parse(resolved)
            except Exception as e:  # noqa: BLE001  ml_collections re-raises with the traceback as the message
                lines = [line for line in str(e).splitlines() if line.strip()]
                raise SystemExit(f"--config={path}: {lines[-1].strip() if lines else type(e).__name__}") from None

    holder = config_flags.DEFINE_config_file("config", None, help_string)
    flags.FLAGS["config"].parser = _RecipeParser(name="config")
    return holder
