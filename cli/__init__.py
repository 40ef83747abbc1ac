"""The `torchfarm` command line: `main.py` parses and dispatches; one module per group of
subcommands (`cache`, `targets`, `warm`)."""

import os

# As the SDK does (sdk/__init__.py): gRPC's C-core would print each failed TLS handshake
# on stderr besides the command's own one line. Read when grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
