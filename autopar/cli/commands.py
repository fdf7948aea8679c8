"""Sub-commands of ``autopar``, one module per command group.

Each module defines ``register(subparsers) -> dict[str, handler]``: it adds its sub-parsers and
returns ``{command name: handler(args) -> exit code}``. Modules must import heavy dependencies
(scipy, optuna, torch, ray) inside their handlers so that ``autopar --help`` stays fast.
"""

# Listed explicitly (not discovered) so the CLI surface is reviewable in one place.
COMMAND_MODULES: tuple[str, ...] = (
    "autopar.cli.predict",
    "autopar.cli.export",
    "autopar.cli.recommend",
    "autopar.cli.study",
    "autopar.cli.sweep",
    "autopar.cli.serve",
    "autopar.cli.compare",
    "autopar.cli.calibrate",
    "autopar.cli.validate",
    "autopar.cli.completion",
    "autopar.cli.dit",
    "autopar.cli.whatif",
)

# Top-level command -> the module that registers it. ``autopar recommend ...`` imports and builds
# only that module's parser (the other modules' flags come from pydantic models it would not use);
# ``--help``, no command or an unknown one builds them all. tests/test_cli_speed.py checks this
# table against what the modules register.
COMMANDS: dict[str, str] = {
    "predict": "autopar.cli.predict",
    "model": "autopar.cli.predict",
    "export": "autopar.cli.export",
    "recommend": "autopar.cli.recommend",
    "study": "autopar.cli.study",
    "sweep": "autopar.cli.sweep",
    "serve": "autopar.cli.serve",
    "compare": "autopar.cli.compare",
    "calibrate": "autopar.cli.calibrate",
    "validate": "autopar.cli.validate",
    "completion": "autopar.cli.completion",
    "dit": "autopar.cli.dit",
    "whatif": "autopar.cli.whatif",
}
