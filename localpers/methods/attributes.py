"""The EXACT attribute library: the 42 preference attributes of the EXACT paper (Table 4), as data.

An attribute set is written into a prompt as one line, `Attributes: <Concise, Vivid, Humor>`, the
template of the paper's Figures 2-7. This module only holds the names and formats that line; selecting
attributes lives in `localpers.methods.exact_greedy` (the search) and `localpers.methods.exact` (the index).
"""

from __future__ import annotations

from collections.abc import Sequence

# Table 4 of the EXACT paper, read column by column (left column first).
ATTRIBUTES: tuple[str, ...] = (
    "Base",
    "Formal",
    "Concise",
    "Vivid",
    "Modest",
    "Engineer",
    "Persuasive",
    "Emotion",
    "Humor",
    "Energy",
    "Code",
    "Easy",
    "Direct",
    "Social",
    "Western",
    "Eastern",
    "Respect",
    "Internet Slang",
    "Proverb",
    "Critical",
    "Vague",
    "Creative",
    "Analytic",
    "Empathetic",
    "Sycophant",
    "Old-fashioned",
    "Meritocratic",
    "Myopic",
    "Principled",
    "Hedonist",
    "Utilitarian",
    "Realist",
    "Pessimistic",
    "Storyteller",
    "Flexible",
    "Spontaneous",
    "Collectivist",
    "Individualistic",
    "Exclamatory",
    "Conspiracy",
    "Tech Industry Priority",
    "Eco-friendly",
)

ATTRIBUTE_LINE_PREFIX = "Attributes: "


def attribute_line(attributes: Sequence[str]) -> str:
    """The line EXACT adds to a prompt: attribute_line(["Concise", "Vivid"]) -> "Attributes: <Concise, Vivid>"."""
    return f"{ATTRIBUTE_LINE_PREFIX}<{', '.join(attributes)}>"
