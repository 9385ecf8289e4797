"""The package's version: the one place it is written (``pyproject.toml`` reads it from here).

A module of its own, not the installed distribution's metadata: jobs run the package from a
wheel passed with ``--py-files``, which Python imports without metadata.
"""

__version__ = "0.1.0"
