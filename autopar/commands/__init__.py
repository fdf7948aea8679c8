"""Sub-commands of ``autopar`` beyond predict/model, one module per command group.

Each module defines ``register(subparsers) -> dict[str, handler]``: it adds its sub-parsers and
returns ``{command name: handler(args) -> exit code}``. Modules must import heavy dependencies
(scipy, optuna, torch, ray) inside their handlers so that ``autopar --help`` stays fast.
"""

# Listed explicitly (not discovered) so the CLI surface is reviewable in one place.
COMMAND_MODULES: tuple[str, ...] = (
    "autopar.commands.export",
    "autopar.commands.recommend",
    "autopar.commands.study",
    "autopar.commands.sweep",
    "autopar.commands.serve",
    "autopar.commands.compare",
    "autopar.commands.calibrate",
    "autopar.commands.validate",
)
