"""The TUI's widgets, one per module; each draws and reports events, the app decides what they mean."""
