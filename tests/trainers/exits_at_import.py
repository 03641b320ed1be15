"""A task module that calls ``sys.exit`` as it is imported (helper-41)."""

import sys

sys.exit(3)
