"""Fresh SSH keys per run, so no two runs (and no image) share a credential or a host identity."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, repr=False)
class RunKeys:
    """A run's two ed25519 key pairs, in OpenSSH format (no passphrase).

    * the **client** pair: the launcher (and mpirun's tree spawn on workers) logs in with the private
      key; every worker's sshd authorises exactly its public key.
    * the **host** pair: every worker's sshd presents it; the launcher accepts no other host key
      (known_hosts), so nothing that answers on a worker's name or IP can pose as a worker.
    """

    client_private: str
    client_public: str
    host_private: str
    host_public: str

    def __repr__(self) -> str:  # never print the private keys (logs, test failures)
        return f"RunKeys(client_public={self.client_public.strip()!r}, host_public={self.host_public.strip()!r})"


def _ssh_keygen(directory: Path, name: str, comment: str) -> tuple[str, str]:
    path = directory / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path.read_text(), path.with_name(name + ".pub").read_text()


def generate_keypair(comment: str) -> RunKeys:
    """A run's client and host key pairs (``comment`` on the client key, ``<comment>-host`` on the host key).

    Uses ``ssh-keygen`` (openssh-client in the operator image): the keys never touch anything but a
    private temporary directory that is removed at once.
    """
    with tempfile.TemporaryDirectory(prefix="mlbench-ssh-") as tmp:
        client_private, client_public = _ssh_keygen(Path(tmp), "client", comment)
        host_private, host_public = _ssh_keygen(Path(tmp), "host", f"{comment}-host")
    return RunKeys(client_private, client_public, host_private, host_public)
