"""`python -m agentrun.cli`: the same as the kubectl-agentrun console script."""

from agentrun.cli.app import main

raise SystemExit(main())
