"""Run a redline command with some of redline's module constants set otherwise, for A/B measurements in one call.

    python scripts/gpu/with_settings.py redline.inference.kernels.decode_attention.SPLIT_BYTES=16384 -- bench-infer ...

Each setting is module.NAME=value, value a Python literal (0, 1, 2048, "x", None); the module is imported and the
constant, which must exist already, is replaced before the command runs in this process. The settings are printed
first, so a log shows what ran.
"""

from __future__ import annotations

import ast
import importlib
import sys


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("usage: with_settings.py module.NAME=value ... -- <redline command and its arguments>")
    cut = argv.index("--")
    for setting in argv[:cut]:
        target, _, text = setting.partition("=")
        module_name, _, name = target.rpartition(".")
        if not module_name or not text:
            sys.exit(f"with_settings.py: {setting!r} is not module.NAME=value")
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            sys.exit(f"with_settings.py: {module_name} has no {name} to set")
        value = ast.literal_eval(text)
        setattr(module, name, value)
        print(f"with_settings: {module_name}.{name} = {value!r}", flush=True)
    from redline.cli import main as redline_main

    redline_main(argv[cut + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
