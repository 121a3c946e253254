"""Test-only crash points: `EKS_DRA_CRASH_POINT=<name>[,<name>...]` kills the process with SIGKILL when it
reaches a named point (the chaos test uses it to crash between every two steps of a recovery).

Unset (always, outside tests) every `reached()` is one module-global comparison and nothing else; the
variable is read once at import. A name may carry `@<n>` to crash at its n-th arrival (default the first).
Points (in order of a run):
    recovery.preserved     the corrupt checkpoint is hard-linked aside, not yet replaced
    recovery.replaced      the rebuilt checkpoint (records from CDI specs) replaced it, records incomplete
    recovery.completed     one rebuilt record was completed from the API and saved
    recovery.reserved      one claim the API shows here (no CDI spec) was recorded as a reservation
    prepare.started        a prepare's record is about to be written, nothing applied yet
    prepare.spec_written   the claim's CDI spec is written, PrepareCompleted not yet recorded
    unprepare.spec_removed the claim's CDI spec is removed, its record not yet dropped
    write.temporary        an atomic write's temporary file is written, not yet renamed
"""

from __future__ import annotations

import os
import signal

ENV = "EKS_DRA_CRASH_POINT"
_armed: dict[str, int] = {}
for _item in filter(None, (os.environ.get(ENV) or "").split(",")):
    _name, _, _count = _item.strip().partition("@")
    _armed[_name] = int(_count or 1)


def reached(name: str) -> None:
    """Die here (SIGKILL, as `kill -9`) if this point is armed and its count is reached."""
    if not _armed or name not in _armed:
        return
    _armed[name] -= 1
    if _armed[name] <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
