"""The benchmarks behind the figures of docs/results.md: each module is a command run from the repository root,
``python -m benchmarks.<name> --help``. A package (not part of the installed wheel: pyproject's package discovery
includes only ``zerotir``, ``sandbox`` and ``callbacks``) so the benchmarks import each other and the repository's
packages without editing ``sys.path``.
"""
