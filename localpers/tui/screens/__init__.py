"""The TUI's modal screens: first-run welcome, history import, edit-and-accept, confirmation."""
