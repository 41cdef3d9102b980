"""localpers: an LLM that writes the way you write, without your writing leaving your machine."""

__version__ = "0.1.0"
