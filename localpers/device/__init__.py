"""The demo user (`demo`): made from the shipped history, fitted, and compared with the baselines.

`localpers demo`, the TUI's first run and scripts call it. A user's fit and rewrite are not here: the commands
(`localpers.cli.device`, the TUI, the API) ask `localpers.methods.registry` for the method and call its
`fit` and `rewrite`. User text is read and written through `localpers.users`.
"""
