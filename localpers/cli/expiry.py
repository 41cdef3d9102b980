"""What every command that signs a repository says afterwards: when each role's metadata expires, and a warning
in the root's last RENEW_ROOT_WITHIN_DAYS days and whenever the targets or the snapshot expire before the timestamp
(devices refuse the whole repository once any has expired; a timestamp-only refresh, the cron job, cannot renew
those two, so it must say when they run out: with the default lifetimes, in their last week).

It only reads the repository's metadata; the signing is in `localpers.bundle.repository`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from localpers.cli.common import echo

RENEW_ROOT_WITHIN_DAYS = 30


def expiry_json(repo: Path) -> dict[str, str]:
    """Each role's expiry date as `--json` gives it (ISO 8601, UTC), e.g. {"root": "2027-12-06T04:00:00Z", ...}."""
    from localpers.bundle.resigning import expiry_dates

    return {role: f"{date:%Y-%m-%dT%H:%M:%SZ}" for role, date in expiry_dates(repo).items()}


def _time_left(left: timedelta) -> str:
    hours = round(left.total_seconds() / 3600)
    return f"{hours} hours" if hours < 48 else f"{round(hours / 24)} days"


def expiry_report(repo: Path, *, dates: bool = True) -> None:
    """Print each role's expiry date on stdout (unless `dates` is False: a `--json` command prints its own), and
    on stderr the warnings that are due: targets or snapshot expiring before the timestamp, the root in its last
    RENEW_ROOT_WITHIN_DAYS days."""
    from localpers.bundle.resigning import expiry_dates

    expires = expiry_dates(repo)
    if dates:
        echo("expires (UTC): " + ", ".join(f"{role} {date:%Y-%m-%d %H:%M}" for role, date in expires.items()))
    now = datetime.now(UTC)
    for role in ("targets", "snapshot"):
        left = expires[role] - now
        # due when the timestamp (which a refresh renews) outlives it: the next refreshes cannot help then
        if expires[role] < expires["timestamp"]:
            renew = f"`localpers repo refresh {repo} --keys KEYS --all` (needs targets.key and snapshot.key)"
            echo(
                f"warning: the {role} metadata of {repo} has expired: devices refuse the repository until it is"
                f" re-signed with {renew}"
                if left <= timedelta(0)
                else f"warning: the {role} metadata of {repo} expires in {_time_left(left)}, before the timestamp"
                f" does, and devices then refuse the repository (a timestamp refresh does not renew it): re-sign"
                f" it before with {renew}",
                err=True,
            )
    left = expires["root"] - now
    if left >= timedelta(days=RENEW_ROOT_WITHIN_DAYS):
        return
    renew = f"`localpers repo refresh {repo} --keys KEYS --root` (needs root.key)"
    echo(
        f"warning: the root of {repo} has expired: devices refuse the repository until it is renewed with {renew}"
        if left <= timedelta(0)
        else f"warning: the root of {repo} expires in {left.days} days, and devices then refuse the repository:"
        f" renew it before with {renew}",
        err=True,
    )
