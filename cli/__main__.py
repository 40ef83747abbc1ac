"""`python -m cli`, as the `torchfarm` script."""

from cli.main import main

raise SystemExit(main())
