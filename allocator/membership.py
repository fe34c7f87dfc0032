"""Who may join a slice it does not own: the container that was given the
owner's device.  A claim share's CDI device (written by the DRA plugin, applied
by the runtime) carries a key for that share, and a container joins the share
only with it.  A pod's author controls the container's environment and can
learn a claim's UID from the API, but not the key: it is an HMAC of the share
under a secret that only the daemon holds (STATE_DIR/membership.key, 0600),
handed to the plugin that writes the device.  The same rule serves every kind
of membership (a device plugin's allocation, next): a subject string per
thing that can be joined.  Deriving the keys, rather than storing them, keeps
them valid across restarts with nothing more in the slice store."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from gpuslice import errors

KEY_NAME = "membership.key"
KEY_BYTES = 32


def claim_share(claim: str, share: str) -> str:
    """The subject of a claim's share."""
    return f"claim-share/{claim}/{share}"


def devices_share(key: str, share: str) -> str:
    """The subject of a device plugin allocation's share (its resource)."""
    return f"devices/{key}/{share}"


class MembershipKey:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def load(cls, state_dir: Path) -> MembershipKey:
        """The node's secret: made once, at the first start, and kept."""
        path = state_dir / KEY_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            secret = path.read_bytes()
            if len(secret) != KEY_BYTES:
                raise errors.FailedPrecondition(
                    f"{path}: {len(secret)} bytes, not a membership key ({KEY_BYTES}); remove it to make a new "
                    "one (claims prepared before must then be prepared again)"
                ) from None
            return cls(secret)
        secret = os.urandom(KEY_BYTES)
        try:
            os.write(fd, secret)
            os.fsync(fd)
        finally:
            os.close(fd)
        return cls(secret)

    @classmethod
    def ephemeral(cls) -> MembershipKey:
        return cls(os.urandom(KEY_BYTES))

    def token(self, subject: str) -> str:
        return hmac.new(self._secret, subject.encode(), hashlib.sha256).hexdigest()[:32]

    def admits(self, subject: str, token: str) -> bool:
        return hmac.compare_digest(self.token(subject), token)
