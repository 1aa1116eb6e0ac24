"""``python -m tokenweir``: the ``tokenweir`` command without the installed console script."""

from tokenweir.cli import main

raise SystemExit(main())
