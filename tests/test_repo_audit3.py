"""A publisher's repository and a device's pull, third audit (eighty-seventh session).

Each test is a case that failed before: a timestamp key of a type TUF cannot sign with ended `repo refresh` in a
traceback; a link at the repository's `.repo.lock` made every repo command create the file it pointed to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_serve_pull import make_bundle, publish

from localpers.bundle.resigning import refresh
from localpers.errors import InputError, LocalpersError


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, str]:
    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    return repo_dir, keys, publish(make_bundle(tmp_path / "bundle"), repo_dir, keys)


@pytest.mark.parametrize("kind", ["x25519", "ed448"])
def test_a_key_of_a_type_tuf_cannot_sign_with_is_one_line(
    published: tuple[Path, Path, str], kind: str
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed448, x25519

    repo_dir, keys, _ = published
    key = (x25519.X25519PrivateKey if kind == "x25519" else ed448.Ed448PrivateKey).generate()
    (keys / "timestamp.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(InputError, match=r"timestamp.key: a .* key, which cannot sign TUF metadata"):
        refresh(repo_dir, keys)


def test_a_link_at_the_repository_lock_is_refused_not_followed(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    repo_dir, keys, _ = published
    (repo_dir / ".repo.lock").unlink()
    target = tmp_path / "made-by-the-lock"
    (repo_dir / ".repo.lock").symlink_to(target)
    with pytest.raises(LocalpersError, match=r"\.repo\.lock is a link"):
        refresh(repo_dir, keys)
    assert not target.exists()
