"""Java sources compiled with the JDK's ``javac`` into a jar cached per machine.

Tidemark ships a few Java classes as sources (the local file system of a local master,
``tidemark.spark.local_file_system``; the conformance oracle's and the benchmark's Flink
connectors) rather than as built jars: each is compiled against the jars of the Spark or
Flink it runs in, which only the machine knows. A jar is keyed by a hash of its sources and
of what it is compiled against, so a changed source or a new Spark or Flink builds a new
one and an unchanged one costs a hash. Standard library only: the Flink oracle imports it
from a virtual environment that has nothing of Tidemark's installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path


def jdk_tool(name: str) -> str | None:
    """``name`` (``java``, ``javac``) from ``$JAVA_HOME/bin``, else from PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", name), os.X_OK):
        return os.path.join(java_home, "bin", name)
    return shutil.which(name)


def cache_dir() -> Path:
    """Where built jars are kept: ``$XDG_CACHE_HOME/tidemark``, else ``~/.cache/tidemark``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tidemark"


def compiled_jar(src: Path, classpath: Sequence[Path], name: str, cache: Path) -> Path:
    """The ``*.java`` files under ``src`` compiled against ``classpath``, with the service
    files under ``src/META-INF/services``, as ``cache/<name>-<hash>.jar`` (built on the first
    call). Raises ``RuntimeError`` naming what is missing or what ``javac`` said."""
    javac = jdk_tool("javac")
    if javac is None:
        raise RuntimeError(f"compiling {name} needs a JDK: no javac on PATH or in JAVA_HOME (a JRE has none)")
    sources = sorted(src.rglob("*.java"))
    services = sorted((src / "META-INF" / "services").glob("*"))
    digest = hashlib.sha256()
    for jar in classpath:
        digest.update(str(jar).encode() + b"\0")
    for f in [*sources, *services]:
        digest.update(f.relative_to(src).as_posix().encode() + b"\0" + f.read_bytes())
    jar = cache / f"{name}-{digest.hexdigest()[:16]}.jar"
    if jar.exists():
        return jar
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        classes = Path(tmp) / "classes"
        done = subprocess.run(
            [javac, "-nowarn", "-d", str(classes), "-cp", os.pathsep.join(map(str, classpath)), *map(str, sources)],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"compiling {name}: javac failed: {done.stderr.strip() or done.stdout.strip()}")
        # written beside the cache's jars, then renamed: two processes building it at once
        # each rename a whole jar of their own
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
            for f in services:
                z.write(f, f"META-INF/services/{f.name}")
        partial.replace(jar)
    return jar
