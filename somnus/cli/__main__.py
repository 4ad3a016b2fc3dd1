"""``python -m somnus.cli``: the same as ``somnus``."""

from somnus.cli import main

main()
