"""`python -m jaxcache ...` is `python -m jaxcache.run ...` (the launcher)."""

import sys

from .run import main

sys.exit(main())
