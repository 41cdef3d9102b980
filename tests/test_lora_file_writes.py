"""`write_lora_gguf` as a user's CoPe adapter needs it: private, and no temp file left behind for good.

Before, a kill while writing left `.cope-new.gguf.partial` (up to 3.8 MB of the user's trained weights) that
nothing swept (its name had no process id), an error left it too, and the adapter was 0644 in a 0700 folder of
0600 files.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from localpers.atomic import atomic_write_text
from localpers.engine.adapters import write_lora_gguf
from localpers.users.lock import user_lock

TENSORS = {"blk.0.attn_q.weight": (np.ones((2, 8), np.float32), np.ones((8, 2), np.float32))}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_private_adapter_is_0600_and_a_published_one_0644(tmp_path: Path) -> None:
    private = write_lora_gguf(tmp_path / "cope-user.gguf", TENSORS, alpha=8.0, private=True)
    published = write_lora_gguf(tmp_path / "cluster-0.gguf", TENSORS, alpha=8.0)
    assert (_mode(private), _mode(published)) == (0o600, 0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster-0.gguf", "cope-user.gguf"]


def test_a_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    bad = {"blk.0.attn_q.weight": (np.ones((2, 8), np.float32), np.ones((8, 3), np.float32))}  # ranks differ
    with pytest.raises(ValueError, match="do not share a rank"):
        write_lora_gguf(tmp_path / "cope-user.gguf", bad, alpha=8.0, private=True)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writers_temp_file_is_swept_by_the_next_write(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os
        import numpy as np
        import gguf
        from localpers.engine.adapters import write_lora_gguf
        gguf.GGUFWriter.write_tensors_to_file = lambda self, **kw: os._exit(9)  # killed mid-write
        write_lora_gguf({str(tmp_path / "cope-user.gguf")!r}, {{"blk.0.attn_q.weight": (np.ones((2, 8)),
                        np.ones((8, 2)))}}, alpha=8.0, private=True)
        """
    )
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert killed.returncode == 9, killed.stderr
    left = [p for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].name.endswith(".partial") and _mode(left[0]) == 0o600
    atomic_write_text(
        tmp_path / "state.json", "{}"
    )  # another file's write leaves it (folders may be the user's)
    assert os.path.exists(left[0])
    with user_lock(tmp_path, who="user 'ann'"):  # the user's folder, locked for any read-modify-write: swept
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "state.json"]
    assert not os.path.exists(left[0])
