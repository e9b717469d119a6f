"""A fresh SSH key pair per run, so no two runs (and no image) share a credential."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def generate_keypair(comment: str) -> tuple[str, str]:
    """Return ``(private_key, public_key)`` in OpenSSH format (ed25519, no passphrase).

    Uses ``ssh-keygen`` (openssh-client in the operator image): the key never touches
    anything but a private temporary directory that is removed at once.
    """
    with tempfile.TemporaryDirectory(prefix="mlbench-ssh-") as tmp:
        path = Path(tmp) / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return path.read_text(), (path.with_suffix(".pub")).read_text()
