"""The ``varbench`` subcommands, one module per group (``bench.cli`` builds the parser and dispatches)."""
