"""The `torchfarm` command line: `main.py` parses and dispatches; one module per group of
subcommands (`cache`, `targets`, `warm`)."""
