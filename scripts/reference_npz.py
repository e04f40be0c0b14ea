"""The deterministic npz writer of the scripts/make_*_references.py scripts: np.savez_compressed's
format with a fixed date on every zip member (numpy stamps the current time), members in the
order the dict gives them, so a reference file's bytes depend only on its arrays and rerunning a
script rewrites the same bytes. np.load reads it.

Imports only numpy and the standard library: the scripts run under a Python that has torch but not
meganeura, and import this sibling as `from reference_npz import write_npz` (each puts its own
folder on sys.path first, so that tests loading a script by path find it too).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip member can carry


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes of the npz holding `arrays`, member `<key>.npy` per key, in the dict's order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """`path`, written with `npz_bytes(arrays)` (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(npz_bytes(arrays))
    return path
