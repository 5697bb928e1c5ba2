"""``python -m calibration.bench --device cpu --small --out DIR``."""

import sys

from calibration.bench.cli import main

sys.exit(main())
