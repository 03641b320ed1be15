import sys

from trainers.cli import main
from trainers.distributed import exit_rank

try:
    status = main()
except SystemExit as e:  # argparse's errors and --help, after their message
    if e.code is None or isinstance(e.code, int):
        status = e.code or 0
    else:  # as Python does with a SystemExit that carries a message
        print(e.code, file=sys.stderr)
        status = 1
exit_rank(status)
