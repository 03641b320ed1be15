import sys

from trainers.cli import main
from trainers.distributed import exit_rank

try:
    status = main()
except SystemExit as e:  # argparse's errors and --help, after their message
    status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    if status == 1 and e.code is not None and not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
exit_rank(status)
