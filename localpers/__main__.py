"""`python -m localpers`: the same command line as the `localpers` console script (`localpers.cli.entry`)."""

from localpers.cli.entry import main

main()
