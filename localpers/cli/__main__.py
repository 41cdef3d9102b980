"""`python -m localpers.cli`: the same command line as the `localpers` console script."""

from localpers.cli.main import main

main()
