"""``python -m visemz`` is the ``visemz`` command."""

from .cli import main

main()
