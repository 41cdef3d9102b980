"""A tiny synthetic two-style corpus for publisher tests, and bench-file items (text written here, no shared data)."""

from __future__ import annotations

import json
from pathlib import Path

TOPICS = [
    ("the city council approved a new budget for parks", "City Council Approves Park Budget"),
    ("a local bakery won a national award for its bread", "Local Bakery Wins National Bread Award"),
    ("heavy rain flooded several streets downtown", "Heavy Rain Floods Downtown Streets"),
    ("the football team signed a young striker", "Football Team Signs Young Striker"),
    ("scientists found a new species of frog", "Scientists Find New Frog Species"),
    ("the museum opened an exhibit on ancient maps", "Museum Opens Ancient Maps Exhibit"),
]


def write_corpus(path: Path, n_users: int = 6) -> Path:
    """Users 0, 2, 4 shout ('BREAKING: ...!'), users 1, 3, 5 whisper ('...quietly, maybe'); 6 items each."""
    lines = []
    for user in range(n_users):
        history = []
        for index, (article, headline) in enumerate(TOPICS):
            if user % 2 == 0:
                output = f"BREAKING: {headline.upper()}!"
            else:
                output = f"{headline.lower()}, quietly, maybe"
            history.append(
                {
                    "id": f"s{user}-{index}",
                    "input": f"Generate a headline for the following article: Reporter {user} says {article}.",
                    "output": output,
                }
            )
        lines.append(json.dumps({"user_id": f"synthetic-{user}", "history": history}))
    path.write_text("\n".join(lines) + "\n")
    return path


def bench_item(number: int, article: str, headline: str) -> dict[str, str]:
    """One history or query item of a bench file (`localpers bench --data`), as the shared data writes it."""
    return {
        "id": f"n{number}",
        "input": f"Generate a headline for the following article: {article}",
        "output": headline,
    }
