"""What the device does for a user: fit and rewrite through the method registry, and the demo user.

Commands (CLI, TUI, API) call these; they in turn ask `localpers.methods.registry` for the method, so
nothing here names CoPe or EXACT. User text is read and written through `localpers.users`.
"""
