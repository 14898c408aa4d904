"""`python -m orchestrator.cli`: the `kappa` command without its console script."""

from orchestrator.cli import main

main()
