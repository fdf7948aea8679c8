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
