"""`python -m flows.cli`: the `mnemo` command."""
from flows.cli import main

main()
