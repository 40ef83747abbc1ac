"""`python -m torchfarm.cli`, as the `torchfarm` script."""

from torchfarm.cli.main import main

raise SystemExit(main())
