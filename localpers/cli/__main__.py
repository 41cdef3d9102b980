"""`python -m localpers.cli`: the same command line as the `localpers` console script, Ctrl-C and stop
signals included (`localpers.cli.entry`)."""

from localpers.cli.entry import main

main()
