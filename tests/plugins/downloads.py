"""What the tests fetch once into the virtualenv (`TOOLS`): files from Maven Central and
elsewhere, checked against the SHA-1 their publisher gives."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

MAVEN = "https://repo1.maven.org/maven2"
TOOLS = Path(sys.prefix) / "share" / "pgoutput-spark-tests"


def download(url: str, sha1: str, path: Path) -> Path:
    """``url`` saved at ``path`` (readable by all) once its SHA-1 is ``sha1``; nothing is left
    at ``path`` otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:
        with urllib.request.urlopen(url, timeout=300) as response:
            shutil.copyfileobj(response, out)
    digest = hashlib.sha1(Path(out.name).read_bytes()).hexdigest()
    if digest != sha1:
        os.unlink(out.name)
        raise RuntimeError(f"{url}: SHA-1 {digest}, expected {sha1}")
    os.chmod(out.name, 0o644)
    os.replace(out.name, path)
    return path
