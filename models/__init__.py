"""Data shipped with localpers: the demo bundle and the demo user's history (no code)."""
